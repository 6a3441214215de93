"""Each attention kind at one size: training tokens/s, decode tokens/s with and without the KV
cache, and KV-cache bytes per token.

    python -m bench.attention [--new-tokens 256 512] [--repeats 3]

Target: on the CPU, cached decoding of 512 new tokens is >= 5x faster than recomputing the
whole context at every step.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench.common import write_result
from llmlab.model.attention import ATTENTION
from llmlab.model.transformer import ModelSpec, Transformer
from llmlab.sample.generate import SamplingConfig, generate

SIZE = {"d_model": 256, "n_layers": 4, "n_heads": 4, "max_seq_len": 1024}
VOCAB = 8192


def build(kind: str) -> Transformer:
    torch.manual_seed(0)
    spec = ModelSpec.from_config({"model": SIZE, "attention": {"kind": kind}, "norm": {}, "pos": {"kind": "rope"}},
                                 VOCAB)
    return Transformer(spec)


def train_tokens_per_s(model: Transformer, repeats: int, batch: int = 8, seq: int = 256) -> float:
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, VOCAB, (batch, seq + 1))
    times = []
    for i in range(repeats + 1):
        t = time.perf_counter()
        loss = model(x[:, :-1], x[:, 1:]).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i:  # the first step warms up
            times.append(time.perf_counter() - t)
    return batch * seq / statistics.median(times)


def decode_tokens_per_s(model: Transformer, new_tokens: int, use_cache: bool, repeats: int) -> float:
    model.eval()
    prompt = torch.randint(0, VOCAB, (1, 16))
    cfg = SamplingConfig(max_new_tokens=new_tokens, temperature=0.0)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        generate(model, prompt, cfg, use_cache=use_cache)
        times.append(time.perf_counter() - t)
    return new_tokens / statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new-tokens", type=int, nargs="+", default=[256, 512])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rows = {}
    for kind in ATTENTION.names():
        model = build(kind)
        row = {"kv_bytes_per_token_fp32": model.kv_cache_bytes_per_token(4),
               "kv_bytes_per_token_bf16": model.kv_cache_bytes_per_token(2),
               "train_tokens_per_s": train_tokens_per_s(model, args.repeats)}
        for n in args.new_tokens:
            cached = decode_tokens_per_s(model, n, True, args.repeats)
            uncached = decode_tokens_per_s(model, n, False, 1 if n > 256 else args.repeats)
            row[f"decode_{n}_cached_tokens_per_s"] = cached
            row[f"decode_{n}_uncached_tokens_per_s"] = uncached
            row[f"decode_{n}_speedup"] = cached / uncached
        rows[kind] = row
        print(f"{kind:>4}: train {row['train_tokens_per_s']:7,.0f} tok/s | "
              + " | ".join(f"decode {n}: {row[f'decode_{n}_cached_tokens_per_s']:6,.1f} cached vs "
                           f"{row[f'decode_{n}_uncached_tokens_per_s']:6,.1f} uncached tok/s "
                           f"({row[f'decode_{n}_speedup']:.1f}x)" for n in args.new_tokens)
              + f" | KV {row['kv_bytes_per_token_bf16']:,} B/token (bf16)", flush=True)
    write_result("attention", {"size": SIZE, "vocab": VOCAB, "target": "decode_512_speedup >= 5 on CPU",
                               "kinds": rows})


if __name__ == "__main__":
    main()
