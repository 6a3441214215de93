"""The LM head and its cross-entropy, forward and backward, alone: the plain path (logits
materialised, ``F.cross_entropy``) against `linear_cross_entropy` (``train.head_loss=fused``).
Time is the median of --repeats; error is the relative norm against a float64 reference.

    python -m bench.head_loss [--rows 32768 --vocab 50304 --d 768]   # GPT-2's head, a 32k-token micro-batch

On CUDA both paths run in bf16 autocast, compiled and eager, timed with CUDA events, with the
peak memory they add over their inputs. On the CPU they run eagerly in fp32 (default sizes:
the default `llmlab train`'s 8 x 256 tokens and 8,192-token vocabulary).
"""

from __future__ import annotations

import argparse
import os
import statistics
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.common import median_of, write_result
from llmlab.model.loss import linear_cross_entropy
from llmlab.model.objective import IGNORE


def cuda_times(fn, repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn``, timed with CUDA events."""
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--vocab", type=int, default=None)
    ap.add_argument("--d", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    rows, vocab, d = (args.rows or (32768 if cuda else 2048), args.vocab or (50304 if cuda else 8256),
                      args.d or (768 if cuda else 256))
    torch.manual_seed(0)
    h = torch.randn(rows, d, device=dev, requires_grad=True)
    w = (torch.randn(vocab, d, device=dev) * 0.05).requires_grad_()
    t = torch.randint(0, vocab, (rows,), device=dev)
    t[::7] = IGNORE

    def plain(h, w, t):
        return F.cross_entropy(F.linear(h, w).float(), t, ignore_index=IGNORE)

    def fused(h, w, t):
        return linear_cross_entropy(h, w, t, IGNORE)

    h.grad = w.grad = None
    ref = plain(h.double(), w.double(), t)
    ref.backward()
    reference = (ref.item(), h.grad.clone(), w.grad.clone())
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else nullcontext()
    variants = [("plain", plain), ("fused", fused)]
    if cuda:
        variants += [("plain compiled", torch.compile(plain)), ("fused compiled", torch.compile(fused))]
    rows_out = []
    for name, fn in variants:
        def step():
            h.grad = w.grad = None
            with amp:
                loss = fn(h, w, t)
            loss.backward()
            return loss
        loss = step()
        err = {"loss_abs": abs(loss.item() - reference[0]),
               "grad_h_rel": ((h.grad - reference[1]).norm() / reference[1].norm()).item(),
               "grad_w_rel": ((w.grad - reference[2]).norm() / reference[2].norm()).item()}
        for _ in range(2):
            step()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            times = cuda_times(step, args.repeats)
        else:
            _, times = median_of(step, args.repeats)
        row = {"variant": name, "ms": statistics.median(times) * 1e3, "spread_ms": [min(times) * 1e3, max(times) * 1e3],
               **err}
        if cuda:
            row["peak_extra_gib"] = (torch.cuda.max_memory_allocated() - base) / 2**30
        rows_out.append(row)
        print(f"{name:15s} {row['ms']:8.2f} ms  loss err {err['loss_abs']:.1e}  grad_h {err['grad_h_rel']:.1e}  "
              f"grad_w {err['grad_w_rel']:.1e}" + (f"  +{row['peak_extra_gib']:.2f} GiB" if cuda else ""), flush=True)
    result = {"rows_per_batch": rows, "vocab": vocab, "d": d, "precision": "bf16 autocast" if cuda else "fp32",
              "results": rows_out}
    path = write_result(f"head_loss_{dev}", result)
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / path.name).write_text(path.read_text())


if __name__ == "__main__":
    main()
