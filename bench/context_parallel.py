"""Ring attention's memory per rank at a long context, on the CPU (gloo).

One causal attention forward and backward over a sequence of ``--tokens`` (16,384) at d 256
(4 heads of 64), split across 1, 2 and 4 ranks (processes) as ``train.context_parallel`` splits
it: each rank holds a contiguous slice of the queries, keys and values, and the blocks travel
around the ring. Per rank: the peak resident memory the attention adds (the process's peak RSS
during the pass, VmHWM reset just before it, less its RSS with its inputs in place; the most
over ``--repeats``), and the time of the pass (the median of ``--repeats``).

    python -m bench.context_parallel                 # about 3 minutes on 2 cores
    python -m bench.context_parallel --tokens 8192 --ranks 1 2

On a 2-core machine 4 ranks share 2 cores, so their time is contended by construction; the
memory is not. Results: bench/results/context_parallel.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as tdist
import torch.multiprocessing as mp

from bench.common import write_result


def status_mb(field: str) -> float:
    """VmRSS (now) or VmHWM (the peak since the last reset) of this process, in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> None:
    """Start the peak (VmHWM) again from the present RSS (Linux: clear_refs 5)."""
    Path("/proc/self/clear_refs").write_text("5")


def worker(rank: int, world: int, store: str, tokens: int, heads: int, head_dim: int, repeats: int, results):
    from llmlab.model.ring import ring_attention

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    tdist.init_process_group("gloo", store=tdist.FileStore(store, world), rank=rank, world_size=world)
    try:
        local = tokens // world
        gen = torch.Generator().manual_seed(rank)
        q, k, v = (torch.randn(1, heads, local, head_dim, generator=gen).requires_grad_() for _ in range(3))
        grad = torch.randn(1, heads, local, head_dim, generator=gen)
        times, added = [], []
        for _ in range(repeats):
            tdist.barrier()
            reset_peak()
            base = status_mb("VmRSS")
            t = time.perf_counter()
            ring_attention(q, k, v).backward(grad)
            times.append(time.perf_counter() - t)
            added.append(status_mb("VmHWM") - base)
            q.grad = k.grad = v.grad = None
        results.put({"rank": rank, "attention_peak_mb": round(max(added), 1), "added_mb": [round(a, 1) for a in added],
                     "seconds": times})
    finally:
        tdist.destroy_process_group()


def run(world: int, args) -> dict:
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory(prefix="llmlab-bench-cp-") as tmp:
        mp.start_processes(worker, args=(world, str(Path(tmp) / "store"), args.tokens, args.heads, args.head_dim,
                                         args.repeats, results), nprocs=world, start_method="spawn")
    ranks = sorted((results.get() for _ in range(world)), key=lambda r: r["rank"])
    step = statistics.median(max(r["seconds"][i] for r in ranks) for i in range(args.repeats))
    out = {"ranks": ranks, "max_attention_peak_mb": max(r["attention_peak_mb"] for r in ranks),
           "seconds_per_pass": round(step, 3)}
    print(f"{world} rank(s), {args.tokens // world:,} positions each: attention peak "
          f"{out['max_attention_peak_mb']:,.0f} MB per rank (most), {step:.2f} s per forward + backward", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rows = {str(n): run(n, args) for n in args.ranks}
    first = rows[str(min(args.ranks))]["max_attention_peak_mb"]
    for n, row in rows.items():
        row["memory_vs_fewest_ranks"] = round(row["max_attention_peak_mb"] / first, 3)
    write_result("context_parallel", {"tokens": args.tokens, "heads": args.heads, "head_dim": args.head_dim,
                                      "cpu_count": os.cpu_count(), "os_load_1min": os.getloadavg()[0],
                                      "by_ranks": rows})


if __name__ == "__main__":
    main()
