"""The INT8 activations' share of a W4A8-G128 body's error, measured where the W4A8 kernel is
too slow to serve a data set.

    python -m benchmarks.dequantized_body W4A8_FOLDER --out W4_FOLDER
    python -m benchmarks.activation_error --model W4_FOLDER [--data SOURCE] [--limit N]

The model is a W4A8 checkpoint's body weights dequantized (`benchmarks.dequantized_body`), so
its weights are exactly the ones the W4A8 kernel multiplies. PCD's plan gives each case's
branches the restricted head serves, and one transformers FP32 forward per branch
(`benchmarks.quantized_quality.branch_hiddens`) gives the hidden state its option scores come
from, twice: with float activations (the weights' error alone, what serving the dequantized
checkpoint measures), and with every body linear's input quantized per token to INT8 as the
W4A8 kernels quantize it (asymmetric, KleidiAI's qai8dxp, which PyTorch's portable
`_dyn_quant_matmul_4bit` also follows: `vllm_pcd_kernels.w4a8.quantize_activations`). Both
are projected by the dense FP32 head and scored as PCD scores. The report: fields whose answer
the activations change, how far apart the option scores are, and each body's accuracy on the
gold with a paired interval.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any, Iterator

import torch
from tqdm import tqdm

from benchmarks import public_data
from benchmarks.quantized_quality import (RESULTS, branch_hiddens, compare, forward_report,
                                          route_fields, served)
from vllm_pcd.calibrate import paired_difference
from vllm_pcd.core.plan import Options, build_plan
from vllm_pcd.core.schema import option_index, parse_schema, value_at
from vllm_pcd_kernels.w4a8 import quantize_activations


def int8_tokens(x: torch.Tensor) -> torch.Tensor:
    """`x` as the kernel sees it: each token's row quantized to asymmetric INT8 and read back."""
    rows = x.reshape(-1, x.shape[-1])
    q, scale, zero = quantize_activations(rows)
    return ((q.float() - zero[:, None].float()) * scale[:, None]).view_as(x).to(x.dtype)


@contextlib.contextmanager
def int8_activations(body: torch.nn.Module) -> Iterator[int]:
    """Every `Linear` of the body reads INT8-quantized inputs while inside; yields how many."""
    hooks = [m.register_forward_pre_hook(lambda _m, args: (int8_tokens(args[0]), *args[1:]))
             for m in body.modules() if isinstance(m, torch.nn.Linear)]
    try:
        yield len(hooks)
    finally:
        for hook in hooks:
            hook.remove()


def measure(model: Any, tokenizer: Any, cases: list[dict[str, Any]], progress: bool = False
            ) -> dict[str, Any]:
    head = model.lm_head.weight.detach().float()
    fields: dict[str, list[Any]] = {"float": [], "int8": []}
    right: dict[str, list[bool]] = {"float": [], "int8": []}
    where: list[dict[str, Any]] = []
    linears = 0
    for case in tqdm(cases, desc="activation error", unit="case", file=sys.stderr,
                     disable=not progress):
        spec = parse_schema(case["schema"])
        plan = build_plan(tokenizer, spec, [{"role": "user", "content": case["message"]}],
                          Options())
        wanted = served(plan)
        runs = {"float": branch_hiddens(model, plan, wanted)}
        with int8_activations(model.model) as linears:
            runs["int8"] = branch_hiddens(model, plan, wanted)
        for key, hiddens in runs.items():
            results = route_fields(plan, hiddens, head, "torch")
            fields[key] += results
            right[key] += [r.best_index == option_index(r.field, value_at(case["expected"],
                                                                          r.field))
                           for r in results]
        where += [{"id": case["id"], "field": plan.fields[plan.scorings[i].field_index]
                   .field.name} for i in wanted]
    return {"cases": len(cases), "body_linears": linears,
            "accuracy": {k: sum(v) / len(v) for k, v in right.items() if v},
            "int8_minus_float": paired_difference(right["float"], right["int8"]),
            "compared": compare(fields["float"], fields["int8"], where)}


def table(report: dict[str, Any]) -> str:
    c, d = report["compared"], report["int8_minus_float"]
    lines = [f"{report['cases']} cases, {c['fields']} fields served by the restricted head; "
             f"{report['body_linears']} body linears read INT8 inputs",
             f"answers the INT8 activations change: {len(c['flips'])} of {c['fields']} "
             f"(agreement {100 * c['agreement']:.1f}%)",
             f"option scores apart: median {c['median_abs_diff']:.4f}, largest "
             f"{c['max_abs_diff']:.4f}",
             f"accuracy: float activations {100 * report['accuracy']['float']:.1f}%, INT8 "
             f"{100 * report['accuracy']['int8']:.1f}%, INT8 − float {100 * d['difference']:+.1f}"
             f" [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]"]
    lines += [f"  flip {f['id']} {f['field']}: {f['reference']!r} -> {f['route']!r} "
              f"(margin {f['reference_margin']:.3f})" for f in c["flips"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.activation_error",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a dequantized W4A8 body (folder)")
    parser.add_argument("--data", default="dev", help="a `benchmarks.public_data` source")
    parser.add_argument("--limit", type=int, help="N cases, drawn as `benchmarks.evaluate` "
                        "draws them")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--out", type=Path, default=RESULTS / "activation_error.json")
    args = parser.parse_args(argv)
    return forward_report(args, {"data": args.data, "limit": args.limit}, measure,
                          public_data.load(args.data, args.limit), table)


if __name__ == "__main__":
    main()
