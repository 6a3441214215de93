"""DeepSeek Sparse Attention against dense attention, on the CPU.

1. Decode: the time of one decode step (batch 1) after a context of 512, 2,048 and 8,192 tokens,
   for mha, mla and dsa (top-k 256 on mla), at d 256, 4 layers, 4 heads: the median over
   repeats of ``--steps`` greedy steps from a prefilled cache. A dense kind reads every cached
   key at every step; dsa's indexer reads every key too, at a width of index_heads x index_dim,
   and its attention reads 256. Reported: ms per token and its growth from the shortest
   context to the longest, per kind.
2. Training: ``llmlab train`` of dsa and of its base (mla) for the same steps on the stdlib
   corpus (the default tiny model, context 256, top-k 64: a query sees at most a quarter of the
   context), validation loss of each.

    python -m bench.sparse_attention                         # about 15 minutes on 2 idle cores
    python -m bench.sparse_attention --contexts 512 2048 --train-steps 0

Results: bench/results/sparse_attention.json. Decode times on a shared machine vary with its
load; each context's kinds run back to back, and the record keeps every repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common import child_env, write_result
from llmlab.model.transformer import ModelSpec, Transformer

SIZE = {"d_model": 256, "n_layers": 4, "n_heads": 4}
VOCAB = 8192
KINDS = {"mha": {"kind": "mha"}, "mla": {"kind": "mla"}, "dsa": {"kind": "dsa", "base": "mla", "topk": 256}}


def build(attention: dict, max_len: int) -> Transformer:
    torch.manual_seed(0)
    spec = ModelSpec.from_config({"model": {**SIZE, "max_seq_len": max_len}, "attention": attention, "norm": {},
                                  "pos": {"kind": "rope"}}, VOCAB)
    return Transformer(spec).eval()


@torch.inference_mode()
def decode_ms(model: Transformer, context: int, steps: int, repeats: int, chunk: int = 512) -> list[float]:
    """ms per decode step after ``context`` tokens, once per repeat (the cache rolled back)."""
    prompt = torch.randint(0, VOCAB, (1, context), generator=torch.Generator().manual_seed(context))
    cache = model.new_cache(1, context + steps)
    for a in range(0, context, chunk):  # prefill in chunks: a sparse kind's scores stay (chunk x context)
        logits = model(prompt[:, a:a + chunk], cache=cache).logits
    first = logits[:, -1:].argmax(-1)
    out = []
    for _ in range(repeats):
        cache.truncate(context)
        token = first
        t = time.perf_counter()
        for _ in range(steps):
            token = model(token, cache=cache).logits[:, -1:].argmax(-1)
        out.append(1000 * (time.perf_counter() - t) / steps)
    return out


def train_runs(steps: int, extra: list[str]) -> dict:
    """``llmlab train`` of dsa and mla for ``steps`` steps; each one's validation loss and time."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="llmlab-bench-dsa-") as tmp:
        env = child_env(LLMLAB_CACHE=str(Path(tmp) / "cache"), TERM="dumb")
        for kind in ("mla", "dsa"):
            words = [f"model={kind}", "optim=adamw", f"train.steps={steps}", "logger=none", "train.ckpt_every=0",
                     "train.sample_tokens=0", f"train.eval_every={steps}", *extra, f"hydra.run.dir={kind}"]
            t = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "llmlab", "train", *words], cwd=tmp, env=env,
                                  capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"llmlab train {' '.join(words)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
            summary = json.loads((Path(tmp) / kind / "summary.json").read_text())
            kl = [json.loads(line).get("indexer/kl") for line in (Path(tmp) / kind / "metrics.jsonl").open()]
            out[kind] = {"command": "llmlab train " + " ".join(words[:-1]), "val_loss": summary["val_loss"],
                         "val_bpb": summary["val_bpb"], "tokens_per_s": summary["tokens_per_s"],
                         "tokens_per_s_other_load": summary.get("tokens_per_s_other_load"),
                         "wall_s": round(time.perf_counter() - t, 1),
                         **({"indexer_kl": [k for k in kl if k is not None]} if kind == "dsa" else {})}
            print(f"train {kind}: val loss {summary['val_loss']:.4f} after {steps} steps, "
                  f"{summary['tokens_per_s']:,.0f} tok/s", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--steps", type=int, default=16, help="decode steps timed per repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--train-steps", type=int, default=300, help="0: no training comparison")
    ap.add_argument("--train", nargs="*", default=[], help="more overrides for both training runs")
    args = ap.parse_args()
    max_len = max(args.contexts) + args.steps
    models = {name: build(attention, max_len) for name, attention in KINDS.items()}
    decode = {name: {} for name in KINDS}
    for context in args.contexts:
        for name, model in models.items():
            times = decode_ms(model, context, args.steps, args.repeats)
            decode[name][str(context)] = {"ms_per_token": statistics.median(times), "repeats_ms": times,
                                          "kv_cache_mb": round(model.kv_cache_bytes_per_token(4) * context / 2**20, 2)}
            print(f"decode {name:>3} after {context:>6,} tokens: {statistics.median(times):7.2f} ms/token "
                  f"(repeats {', '.join(f'{t:.2f}' for t in times)})", flush=True)
    lo, hi = str(min(args.contexts)), str(max(args.contexts))
    growth = {name: d[hi]["ms_per_token"] / d[lo]["ms_per_token"] for name, d in decode.items()}
    at_longest = {f"{name}_over_dsa": decode[name][hi]["ms_per_token"] / decode["dsa"][hi]["ms_per_token"]
                  for name in KINDS if name != "dsa"}
    print(f"growth from {lo} to {hi} tokens: " + ", ".join(f"{n} {g:.2f}x" for n, g in growth.items())
          + "; at " + hi + ": " + ", ".join(f"{k.split('_')[0]} takes {v:.2f}x dsa's time" for k, v in at_longest.items()))
    result = {"size": SIZE, "vocab": VOCAB, "kinds": KINDS, "decode_steps": args.steps,
              "decode": decode, "growth": growth, "at_longest": at_longest,
              "threads": torch.get_num_threads(), "os_load_1min": os.getloadavg()[0]}
    if args.train_steps:
        result["train"] = train_runs(args.train_steps, args.train)
    write_result("sparse_attention", result)


if __name__ == "__main__":
    main()
