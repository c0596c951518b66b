#!/usr/bin/env bash
# Set up (if needed), start `VLLM_PLUGINS=pcd vllm serve` on the default model, send one PCD
# request, print the answer with its diagnostics, and stop the server.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
"$repo/scripts/setup.sh"
exec "${PCD_VENV:-$repo/.venv}/bin/python" -m vllm_pcd.demo "$@"
