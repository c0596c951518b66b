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
  # What runs on FlagOS hosts' vLLM: end to end, fidelity, the fork's token accounting and
  # its copy-on-write, the restricted head, the engine channel and grouped admission, hostile
  # input, the decision routes, every door, neighbours on a shared server, the planning bounds,
  # conditioned fields, vLLM's own structured-output idioms (chat and Responses API), offline
  # batches sized to the KV cache, the package's shape (its version adapters), the
  # patch-target check, the plugin beside Hugging Face's `kernels` and transformers, and the
  # cost of hostile schemas and bodies.
  default_tests="tests/test_architecture.py tests/test_host_packages.py tests/test_conditioned.py
    tests/test_server_e2e.py tests/test_fidelity.py tests/test_fork.py tests/test_lm_head.py
    tests/test_channel.py tests/test_admission.py
    tests/test_reliability.py tests/test_faults.py tests/test_decisions.py
    tests/test_decisions_e2e.py tests/test_doors.py tests/test_shared_server.py
    tests/test_neighbours.py tests/test_planning_bounds.py tests/test_structured_outputs.py
    tests/test_cow.py tests/test_responses_api.py tests/test_targets.py
    tests/test_offline_batches.py tests/test_schema_cost.py tests/test_hostile_bodies.py"
else
  venv=${PCD_VENV:-$repo/.venv}
  default_tests=tests
fi
# shellcheck disable=SC2086  # the test list is split on whitespace on purpose
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider ${PCD_TESTS:-$default_tests} "$@"
