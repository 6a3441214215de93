"""Activation checkpointing on the CPU: peak memory (the whole process tree's RSS, sampled
every 0.1 s) and step time of the default model's training step at long contexts, with
``train.activation_checkpointing=none|full|selective``. Each (context, mode) runs in a process
of its own, so one's peak is not another's; the step time is the median of --steps steps after
one warm-up step, on the fused head loss (so the logits are not what fills the memory), with
the share of the CPU other work used meanwhile (``other_load``: above about 0.1 the times are
contended).

    python -m bench.activation_checkpointing [--contexts 1024,2048,4096 --batch 2 --steps 3]

Results: bench/results/activation_checkpointing.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

MODES = ("none", "full", "selective")


def child(ctx: int, mode: str, batch: int, steps: int) -> None:
    import torch

    from bench.common import train_config
    from llmlab.model.transformer import ModelSpec, Transformer

    torch.manual_seed(0)
    spec = ModelSpec.from_config(train_config([f"model.max_seq_len={ctx}"]), vocab_size=8192)
    model = Transformer(spec).train()
    model.checkpointing = mode
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    times, losses = [], []
    for _ in range(steps + 1):
        x = torch.randint(0, 8192, (batch, ctx + 1), generator=g)
        t = time.perf_counter()
        loss = model(x[:, :-1], x[:, 1:], logits=False, head_loss="fused").loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t)
        losses.append(loss.item())
    print(json.dumps({"step_s": statistics.median(times[1:]), "losses": losses}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", default="1024,2048,4096")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--child", nargs=2, metavar=("CTX", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(int(args.child[0]), args.child[1], args.batch, args.steps)
        return
    from bench.common import REPO, child_env, write_result
    from bench import tokenize_scale

    rows = []
    for ctx in (int(c) for c in args.contexts.split(",")):
        for mode in MODES:
            cmd = [sys.executable, "-m", "bench.activation_checkpointing", "--child", str(ctx), mode,
                   "--batch", str(args.batch), "--steps", str(args.steps)]
            wall, (peak, _), done = tokenize_scale.run_watched(cmd, REPO, child_env())
            out = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append({"context": ctx, "mode": mode, "peak_rss_gb": round(peak / 1e9, 3),
                         "step_s": round(out["step_s"], 3), "losses": out["losses"],
                         "other_load": tokenize_scale.LOADS[-1] if tokenize_scale.LOADS else None})
            print(f"context {ctx:5d} {mode:9s} peak {peak / 1e9:.2f} GB  step {out['step_s']:.2f} s", flush=True)
    for row in rows:  # the same losses bit for bit, and each mode against none at its context
        base = next(r for r in rows if r["context"] == row["context"] and r["mode"] == "none")
        row["same_losses"] = row["losses"] == base["losses"]
        row["memory_vs_none"] = round(row["peak_rss_gb"] / base["peak_rss_gb"], 3)
        row["time_vs_none"] = round(row["step_s"] / base["step_s"], 3)
    write_result("activation_checkpointing", {"command": "python -m bench.activation_checkpointing " + " ".join(sys.argv[1:]),
                                              "batch": args.batch, "rows": rows})


if __name__ == "__main__":
    main()
