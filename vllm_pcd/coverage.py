"""Which body linears of a model run the W4A8-G128 scheme in vLLM, and which route PCD's LM
head takes, as the engine counts them when it loads the model (`internals.coverage`):

    python -m vllm_pcd.coverage MODEL_DIR [--dtype bfloat16] [--strict] [--load-format dummy]

Loads MODEL_DIR in an offline vLLM engine with the plugin (eager, nothing is served) and prints
the counts as one JSON line, the last of its output; exit 1 when a body linear falls back or
PCD cannot project the head, so a deployment can gate on it before serving. `--strict` loads it as
`additional_config.pcd.strict_coverage` would, refusing the start itself. `--load-format dummy`
builds the model from its config alone (random weights, vLLM's own dummy loader): the counts
describe the layers vLLM builds, so a checkpoint's layout can be checked before its weights exist.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from vllm_pcd.internals import coverage as counted


def _worker_coverage(worker: Any) -> dict[str, Any]:
    return counted.count(worker.model_runner, worker.vllm_config).as_dict()


def measure(model: str, dtype: str | None = None, strict: bool = False,
            load_format: str = "auto") -> dict[str, Any]:
    """The coverage of `model` as vLLM loads it here, with the plugin."""
    os.environ["VLLM_PLUGINS"] = "pcd"
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the worker is this process
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    from vllm_pcd.models import fast_dtype

    llm = LLM(model, dtype=dtype or fast_dtype(), enforce_eager=True, max_model_len=512,
              load_format=load_format, additional_config={"pcd": {counted.CONFIG_KEY: strict}})
    [report] = llm.collective_rpc(_worker_coverage)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_pcd.coverage")
    parser.add_argument("model")
    parser.add_argument("--dtype", help="default: this CPU's faster dtype")
    parser.add_argument("--strict", action="store_true")
    parser.add_argument("--load-format", default="auto", choices=["auto", "dummy"],
                        help="dummy: count the layers the config builds, without its weights")
    args = parser.parse_args(argv)
    report = measure(args.model, args.dtype, args.strict, args.load_format)
    print(json.dumps(report))
    return 0 if report["fallback"] == 0 and report["head_route"] else 1


if __name__ == "__main__":
    sys.exit(main())
