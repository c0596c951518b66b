#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite on the default model.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
"$repo/scripts/setup.sh"
cd "$repo"
exec "${PCD_VENV:-$repo/.venv}/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
