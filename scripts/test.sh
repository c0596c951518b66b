#!/usr/bin/env bash
# Set up (if needed) and run the test suite on the default model.
#   ./scripts/test.sh [pytest options]               the whole suite, on vLLM 0.32.0
#   PCD_VLLM=0.24.0 ./scripts/test.sh                the vLLM 0.24.0 (FlagOS) subset
# PCD_TESTS overrides which test files run.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
"$repo/scripts/setup.sh"
cd "$repo"
if [ "${PCD_VLLM:-0.32.0}" = 0.24.0 ]; then
  venv=${PCD_VENV:-$repo/.venv-0.24}
  # What runs on FlagOS hosts' vLLM: the test files marked `vllm024` (end to end, fidelity,
  # the fork and its copy-on-write, the restricted head, admission, hostile input, every door,
  # the decision routes, neighbours, structured outputs, offline batches, W4A8-G128 checkpoints,
  # the package's shape and its neighbours in site-packages).
  default_tests=tests
  select=(-m vllm024)
else
  venv=${PCD_VENV:-$repo/.venv}
  default_tests=tests
  select=()
fi
# shellcheck disable=SC2086  # the test list is split on whitespace on purpose
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "${select[@]}" ${PCD_TESTS:-$default_tests} "$@"
