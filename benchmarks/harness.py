"""What every benchmark does around its measurement: start (or attach to) the server, record
the code measured, and publish the results beside their figure."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator, Sequence

from benchmarks.methods import SERVER_ARGS
from vllm_pcd.models import default_model_path, fast_dtype


def server_parser(name: str, doc: str, quick: str) -> argparse.ArgumentParser:
    """The arguments of a benchmark run against a server: --url, --model, --quick, --out
    (default benchmarks/results/<name>[-quick])."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.bench_{name}",
                                     description=doc.split("\n")[0])
    parser.add_argument("--url", help="attach to a running server (pcd plugin + xgrammar)")
    parser.add_argument("--model", default=str(default_model_path()))
    parser.add_argument("--quick", action="store_true", help=quick)
    add_server_flags(parser)
    parser.add_argument("--out", type=Path, help="output path without suffix "
                        f"(default benchmarks/results/{name}[-quick])")
    return parser


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    """--server-flags: an operator's own `vllm serve` flags for the server a benchmark starts."""
    parser.add_argument("--server-flags", default="", help="more `vllm serve` flags for the "
                        "server it starts, e.g. \"--block-size 32\" (ignored with --url)")


def serving_note(url: str | None, server_flags: str, dtype: str | None = None) -> str:
    """What served the figures: the started server's dtype (the fast one unless named) and
    flags, or the server attached to."""
    if url:
        return f"attached to {url}: dtype and flags as that server was started"
    fast = fast_dtype()
    named = (f"{dtype}, named" if dtype and dtype != fast
             else f"{fast} (the faster dtype on this CPU)")
    return (f"serving {named}, one server: pcd plugin + xgrammar structured outputs"
            + (f", with {server_flags}" if server_flags else ""))


def provenance() -> dict[str, Any]:
    """The code measured: commit, and whether the work tree differed from it."""
    repo = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
        return done.stdout.strip()

    return {"commit": git("rev-parse", "--short", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def panel_row(count: int, panel_size: tuple[float, float] = (5, 4)) -> tuple[Any, Any]:
    """A headless figure of `count` panels of `panel_size` inches side by side: (figure, its
    row of axes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width, height = panel_size
    fig, axes = plt.subplots(1, count, figsize=(width * count, height), squeeze=False)
    return fig, axes[0]


def save_reliability(curves: list[tuple[list[dict[str, float]], str, str]], title: str,
                     path: Path, legend_size: int) -> None:
    """Share correct against the returned probability, beside the diagonal of perfect
    calibration: one (bins, label, line style) curve each, as evaluate and calibration plot it."""
    fig, (ax,) = panel_row(1, panel_size=(5.5, 5))
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", label="perfect calibration")
    for bins, label, style in curves:
        ax.plot([b["confidence"] for b in bins], [b["accuracy"] for b in bins], marker="o",
                linestyle=style, label=label)
    ax.set(xlabel="probability of the returned value", ylabel="share correct", xlim=(0, 1),
           ylim=(0, 1), title=title)
    ax.legend(fontsize=legend_size, loc="upper left")
    save_figure(fig, path, dpi=110)


def save_figure(fig: Any, path: Path, dpi: int = 120) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def publish(out: Path, results: dict[str, Any], plot: Callable[[Path], None],
            table: Callable[[dict[str, Any]], str]) -> None:
    """A benchmark's results beside `out`: JSON and PNG, then its table on stdout."""
    out.with_suffix(".json").write_text(json.dumps(results, indent=2))
    plot(out.with_suffix(".png"))
    print(table(results))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


def run_on_server(args: Any, run: Callable[[Any, str, str], Awaitable[dict[str, Any]]]
                  ) -> dict[str, Any]:
    """Start (or attach to, with --url) the server and run one measurement coroutine on it."""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    serving = serving_note(args.url, args.server_flags)
    print(serving, file=sys.stderr)
    with server(args.url, args.model, args.out.with_suffix(".server.log"),
                flags=args.server_flags) as url:
        return asyncio.run(run(args, url, serving))


def measure_and_publish(args: Any, run: Callable[[Any, str, str], Awaitable[dict[str, Any]]],
                        plot: Callable[[dict[str, Any], Path], None],
                        table: Callable[[dict[str, Any]], str]) -> dict[str, Any]:
    """A server benchmark's whole run: measure on its server, then publish beside `args.out`."""
    results = run_on_server(args, run)
    publish(args.out, results, lambda path: plot(results, path), table)
    return results


@contextlib.contextmanager
def server(url: str | None, model: str | Path, log_path: Path, kv_cache_gib: int = 2,
           flags: str = "", base_args: Sequence[str] = SERVER_ARGS) -> Iterator[str]:
    """Attach to `url`, or start one server with `base_args` (the plugin, the xgrammar backend,
    the fast dtype) and `flags`, an operator's own `vllm serve` flags, split as a shell
    would."""
    if url:
        yield url
        return
    from vllm_pcd.launch import serve

    log_path.parent.mkdir(parents=True, exist_ok=True)
    with serve(model, args=(*base_args, *shlex.split(flags)), kv_cache_gib=kv_cache_gib,
               log_path=log_path) as base:
        yield base
