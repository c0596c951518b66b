"""Restricted vs full-vocabulary LM-head projection, timed side by side in one run.

full:       (h · Wᵀ) over the whole vocabulary in the weight dtype (BF16), then the allowed
            columns: what the engine's LM head does before PCD reads its option logits.
restricted: vllm_pcd_kernels.project(h, W, allowed), with the route selected for the device; its
            time includes the id checks it does on every call.
Ids are drawn per row at random (no sharing between rows: the restricted path's worst case).
Each pair is timed alternately, so load on the machine hits both alike; medians are shown.

    python -m benchmarks.bench_projection [--quick] [--device cuda] [--threads 1] [--strategies]

On a shared CPU, --threads 1 avoids OpenMP stalls when the other thread is descheduled.

--strategies times the per-row CPU strategies of vllm_pcd_kernels.projection.gathered_matmul.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from vllm_pcd_kernels import project


def medians(fns, reps: int, device: torch.device) -> list[float]:
    """Median seconds of each fn, calls interleaved."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = [[] for _ in fns]
    for fn in fns:  # warm up (and compile)
        fn()
    for _ in range(reps):
        for fn, acc in zip(fns, times):
            sync()
            start = time.perf_counter()
            fn()
            sync()
            acc.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def compare(args, device: torch.device) -> None:
    vocabs, hiddens, ks = (49152, 73448), (576, 2560), (2, 8, 32, 256)
    if args.quick:
        vocabs, hiddens, ks = (49152,), (576,), (2, 32)
    print(f"device {device}, bf16 weights, threads {torch.get_num_threads()}, "
          f"median of {args.reps}")
    print(f"{'vocab':>6} {'hidden':>6} {'batch':>5} {'K':>4} {'route':>8} "
          f"{'full ms':>9} {'restr. ms':>9} {'full/restr':>10}")
    for vocab in vocabs:
        for hidden in hiddens:
            weight = (torch.randn(vocab, hidden, device=device) / hidden ** 0.5).bfloat16()
            for batch in (1, 32):
                h = torch.randn(batch, hidden, device=device)
                for k in ks:
                    allowed = torch.randint(0, vocab, (batch, k), device=device)
                    route = project(h, weight, allowed).route
                    full, restricted = medians(
                        [lambda: (h.to(weight.dtype) @ weight.T).gather(1, allowed),
                         lambda: project(h, weight, allowed)], args.reps, device)
                    print(f"{vocab:>6} {hidden:>6} {batch:>5} {k:>4} {route:>8} "
                          f"{full * 1e3:>9.3f} {restricted * 1e3:>9.3f} "
                          f"{full / restricted:>10.1f}", flush=True)


def strategies(args, device: torch.device) -> None:
    """Per-row ids: one matmul onto the union of ids vs a batched mat-vec on gathered rows."""
    vocab, batch = 73448, 32
    print(f"per-row strategies, vocab {vocab}, batch {batch}; union = distinct ids")
    print(f"{'hidden':>6} {'K':>4} {'union':>6} {'union ms':>9} {'bmm ms':>9} {'mul-sum ms':>10} "
          f"{'chunked ms':>10}")
    for hidden in (576, 2560):
        weight = torch.randn(vocab, hidden, device=device).bfloat16()
        h = torch.randn(batch, hidden, device=device).bfloat16().float()
        for k in (8, 32, 256):
            for pool in (k, 4 * k, vocab):  # how many ids the rows draw from
                ids = torch.randperm(vocab, device=device)[:pool]
                allowed = ids[torch.randint(0, pool, (batch, k), device=device)]
                flat = allowed.reshape(-1)

                def union():
                    u, inverse = torch.unique(allowed, return_inverse=True)
                    return (h @ weight.index_select(0, u).float().T).gather(1, inverse)

                def bmm():
                    rows = weight.index_select(0, flat).view(batch, k, -1).float()
                    return torch.bmm(rows, h.unsqueeze(2)).squeeze(2)

                def mul_sum():
                    rows = weight.index_select(0, flat).view(batch, k, -1).float()
                    return (rows * h[:, None, :]).sum(-1)

                def chunked():  # what gathered_matmul does when rows share few ids
                    step = max(1, (1 << 18) // (k * hidden))
                    return torch.cat([(weight.index_select(0, allowed[s:s + step].reshape(-1))
                                       .view(-1, k, hidden).float() * h[s:s + step, None]).sum(-1)
                                      for s in range(0, batch, step)])

                t = medians([union, bmm, mul_sum, chunked], args.reps, device)
                print(f"{hidden:>6} {k:>4} {len(allowed.unique()):>6} {t[0] * 1e3:>9.3f} "
                      f"{t[1] * 1e3:>9.3f} {t[2] * 1e3:>10.3f} {t[3] * 1e3:>10.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few small cases")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--strategies", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.reps = args.reps or (5 if args.quick else 15)
    device = torch.device(args.device)
    torch.manual_seed(0)
    with torch.inference_mode():
        (strategies if args.strategies else compare)(args, device)


if __name__ == "__main__":
    main()
