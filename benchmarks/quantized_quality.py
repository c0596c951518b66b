"""Quality of the quantized LM-head projection routes against the dense FP32 projection.

    python -m benchmarks.quantized_quality [--model PATH] [--limit N] [--data PATH]

For every dev case and formulation, PCD's plan gives the branches the restricted LM head
serves (`Scoring.restricted`: a token-mode field scored by one request); one plain
transformers FP32 forward per branch gives the final-norm hidden state at its last position,
and every route projects it onto the branch's allowed ids. Scores are PCD's: log-softmax over
the allowed logits, then over the field's options. A route is compared with `torch/fp32`
field by field: is the chosen option the same, and how far apart are the scores. The
quantized routes quantize the BF16 head, as FlagOS does. CPU only; the Triton route runs
under TRITON_INTERPRET=1, which this script sets for itself.
"""

import os

if __name__ == "__main__":  # must precede `import triton`, which transformers already does
    os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from benchmarks.evaluate import DEFAULT_DATA, _num, _pct, load_cases  # noqa: E402
from benchmarks.harness import provenance  # noqa: E402
from benchmarks.client import load_tokenizer  # noqa: E402
from benchmarks.metrics import median  # noqa: E402
from vllm_pcd_kernels import project  # noqa: E402
from vllm_pcd.core.plan import DEFAULT_FORMULATION, Options, Plan, build_plan  # noqa: E402
from vllm_pcd.core.scoring import FieldResult, RequestReport  # noqa: E402
from vllm_pcd.core.schema import parse_schema  # noqa: E402

# label -> (kernels route, dtype of the head it projects)
ROUTES = {
    "torch/fp32": ("torch", torch.float32),
    "torch/bf16": ("torch", torch.bfloat16),
    "w8a8-torch": ("w8a8-torch", torch.bfloat16),
    "w4a8-torch": ("w4a8-torch", torch.bfloat16),
    "w4a8-triton": ("w4a8-triton", torch.bfloat16),
    "w4a8-flaggems": ("w4a8-flaggems", torch.bfloat16),
}
REFERENCE = "torch/fp32"
RESULTS = Path(__file__).resolve().parent / "results"


def load_model(path: str | Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def runnable(routes: dict[str, tuple[str, torch.dtype]], heads: dict[torch.dtype, torch.Tensor]
             ) -> tuple[dict[str, str], dict[str, str]]:
    """Routes that run here (label -> the route `project` reports), and why the others
    cannot: one projection of a zero row is the probe, so the reason is the dispatcher's."""
    ok, skipped = {}, {}
    for label, (route, dtype) in routes.items():
        head = heads[dtype]
        try:
            ok[label] = project(head.new_zeros(1, head.shape[1]).float(), head,
                                torch.tensor([0]), route=route).route
        except ValueError as err:
            skipped[label] = str(err)
    return ok, skipped


@torch.inference_mode()
def branch_hiddens(model: Any, plan: Plan, wanted: list[int]) -> dict[int, torch.Tensor]:
    """Final-norm hidden state [H] at the last position of each wanted scoring's branch.

    The shared context is computed once; each branch then runs its last shared token and its
    own tokens on that cache, which is cropped back after it (the same as a forward over the
    whole branch, up to float order)."""
    from transformers import DynamicCache

    scorings = plan.scorings
    shared = list(plan.shared_ids)
    cache = DynamicCache()
    model.model(torch.tensor([shared[:-1]]), past_key_values=cache, use_cache=True)
    out = {}
    for i in wanted:
        ids = torch.tensor([[shared[-1], *scorings[i].suffix_ids]])
        state = model.model(ids, past_key_values=cache, use_cache=True).last_hidden_state
        out[i] = state[0, -1]
        cache.crop(-ids.shape[1])
    return out


def served(plan: Plan) -> list[int]:
    """Scorings the restricted LM head serves in the engine; the others use the full head."""
    return [i for i, s in enumerate(plan.scorings) if s.restricted]


def route_fields(plan: Plan, hiddens: dict[int, torch.Tensor], head: torch.Tensor,
                 route: str) -> list[FieldResult]:
    """PCD's field result from this route's logits, per served scoring (each its own field):
    log-softmax over the allowed ids, as the restricted head's -inf row gives the engine."""
    scorings = plan.scorings
    out = []
    for i, hidden in hiddens.items():
        s = scorings[i]
        logits = project(hidden[None], head, torch.tensor(s.token_ids), route=route).logits[0]
        logprobs = dict(zip(s.token_ids, torch.log_softmax(logits.double(), 0).tolist()))
        # scored as the engine scores a restricted row: the field plan's own `score`
        report = RequestReport(0, 0, None, logprobs, asked_restricted=True)
        out.append(plan.fields[s.field_index].score([report], "sum"))
    return out


def compare(reference: list[FieldResult], other: list[FieldResult], where: list[dict[str, Any]]
            ) -> dict[str, Any]:
    """Agreement of chosen options and score differences, field by field."""
    gaps = [max(abs(a - b) for a, b in zip(r.scores, o.scores))
            for r, o in zip(reference, other)]
    flips = [{**w, "reference": r.value, "route": o.value, "reference_margin": r.margin}
             for r, o, w in zip(reference, other, where) if r.best_index != o.best_index]
    return {
        "fields": len(reference),
        "agreement": 1 - len(flips) / len(reference) if reference else None,
        "max_abs_diff": max(gaps, default=None),
        "median_abs_diff": median(gaps) if gaps else None,
        "flips": flips,
    }


def measure(model: Any, tokenizer: Any, cases: list[dict[str, Any]],
            routes: dict[str, tuple[str, torch.dtype]] = ROUTES,
            formulations: tuple[str, ...] = (DEFAULT_FORMULATION, "codes"), progress: bool = False
            ) -> dict[str, Any]:
    """The report: per formulation, each runnable route against `torch/fp32`."""
    weight = model.lm_head.weight.detach()
    heads = {torch.float32: weight.float(), torch.bfloat16: weight.bfloat16()}
    labels, skipped = runnable(routes, heads)
    results: dict[str, dict[str, list[FieldResult]]] = {f: {r: [] for r in labels}
                                                        for f in formulations}
    where: dict[str, list[dict[str, Any]]] = {f: [] for f in formulations}
    counts = {f: {"fields": 0, "served": 0} for f in formulations}
    for case in tqdm(cases, desc="quantized quality", unit="case", file=sys.stderr,
                     disable=not progress):
        spec = parse_schema(case["schema"])
        messages = [{"role": "user", "content": case["message"]}]
        for form in formulations:
            plan = build_plan(tokenizer, spec, messages, Options(formulation=form))
            hiddens = branch_hiddens(model, plan, served(plan))
            counts[form]["fields"] += len(plan.fields)
            counts[form]["served"] += len(hiddens)
            for label in labels:
                route, dtype = routes[label]
                results[form][label] += route_fields(plan, hiddens, heads[dtype], route)
            scorings = plan.scorings
            where[form] += [{"id": case["id"], "field": plan.fields[scorings[i].field_index]
                             .field.name} for i in hiddens]
    return {
        "cases": len(cases),
        "reference": REFERENCE,
        "routes": labels,
        "skipped_routes": skipped,
        "formulations": {
            form: {**counts[form],
                   "compared": {label: compare(results[form][REFERENCE], got, where[form])
                                for label, got in results[form].items()}}
            for form in formulations},
    }


def table(report: dict[str, Any]) -> str:
    lines = [f"{report['cases']} cases, {report.get('model', '')}; against {report['reference']}",
             f"{'formulation':<12}{'route':<16}{'as run':<24}{'fields':>7}{'agree':>8}"
             f"{'max|d|':>10}{'med|d|':>10}"]
    for form, rep in report["formulations"].items():
        for label, row in rep["compared"].items():
            lines.append(f"{form:<12}{label:<16}{report['routes'][label]:<24}{row['fields']:>7}"
                         f"{_pct(row['agreement']):>8}"
                         f"{_num(row['max_abs_diff'], '.4f'):>10}"
                         f"{_num(row['median_abs_diff'], '.4f'):>10}")
        lines.append(f"{form}: {rep['served']} of {rep['fields']} fields served by the "
                     "restricted head; a field that needs several requests takes the full head")
    lines += [f"not run: {label}: {why}" for label, why in report["skipped_routes"].items()]
    for form, rep in report["formulations"].items():
        for label, row in rep["compared"].items():
            lines += [f"  flip {form} {label} {f['id']} {f['field']}: {f['reference']!r} -> "
                      f"{f['route']!r} (margin {f['reference_margin']:.3f})" for f in row["flips"]]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from vllm_pcd.models import default_model_path

    parser = argparse.ArgumentParser(prog="python -m benchmarks.quantized_quality",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(default_model_path()),
                        help="a local transformers model folder")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--limit", type=int, help="only the first N cases")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--out", type=Path, default=RESULTS / "quantized_quality.json")
    return parser.parse_args(argv)


def forward_report(args: argparse.Namespace, header: dict[str, Any],
                   measure: Callable[..., dict[str, Any]], cases: list[dict[str, Any]],
                   table: Callable[[dict[str, Any]], str]) -> dict[str, Any]:
    """`measure` over the model's transformers forward on `cases`, its report written to
    `args.out` with what ran it, and its table printed."""
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    report = {"model": args.model, **header, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "code": provenance(), **measure(load_model(args.model),
                                              load_tokenizer(args.model), cases, progress=True)}
    report["elapsed_s"] = round(time.perf_counter() - start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(table(report))
    print(f"wrote {args.out}")
    return report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    return forward_report(args, {"data": str(args.data)}, measure,
                          load_cases(args.data, args.limit), table)


if __name__ == "__main__":
    main()
