"""GPT-2-124M (d 768, 12 layers, 12 heads, context 1024, vocab 50,257) on one CUDA GPU:
``llmlab train`` with bf16, torch.compile, flash SDPA and fused AdamW, beside the plain
PyTorch loop of bench/plain.py on the same tokens, in the same run.

    python -m bench.gpu [--steps 200] [--batch-size 16]

Target: MFU >= 50% on an H100 (dense bf16 peak from the data sheet).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common import child_env, train_config, write_result

GPT2 = ["model=gpt2", "optim=adamw", "model.d_model=768", "model.n_layers=12", "model.n_heads=12", "model.max_seq_len=1024",
        "tokenizer.vocab_size=50257"]


def flash_check(cfg: dict, vocab: int, batch: int) -> dict:
    """One forward and backward of the llmlab model with only the flash kernel allowed: it
    raises if any attention call could not use it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from llmlab.model.transformer import ModelSpec, Transformer
    model = Transformer(ModelSpec.from_config(cfg, vocab)).cuda()
    x = torch.randint(0, vocab, (batch, cfg["model"]["max_seq_len"]), device="cuda")
    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), torch.autocast("cuda", dtype=torch.bfloat16):
            model(x, x).loss.backward()
        return {"flash_sdpa": True}
    except RuntimeError as e:
        return {"flash_sdpa": False, "flash_error": str(e).splitlines()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--skip-plain", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench.gpu: no CUDA GPU here")
    compile_flag = "false" if args.no_compile else "true"
    overrides = [*GPT2, "precision=bf16", f"train.compile={compile_flag}", f"train.batch_size={args.batch_size}",
                 f"train.steps={args.steps}", "train.log_every=10", "train.eval_every=0", "train.eval_windows=16",
                 "train.ckpt_every=0", "train.prompts=[]", "logger=none"]
    result: dict = {"gpu": torch.cuda.get_device_name(), "overrides": overrides}
    with tempfile.TemporaryDirectory(prefix="llmlab-bench-gpu-") as tmp:
        env = child_env(LLMLAB_CACHE=str(Path(tmp) / "cache"))
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "llmlab", "tokenize", *[o for o in GPT2 if o.startswith("tokenizer")]],
                       cwd=tmp, env=env, check=True)
        result["tokenize_s"] = round(time.perf_counter() - t, 1)
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "llmlab", "train", "hydra.run.dir=run", *overrides], cwd=tmp, env=env,
                       check=True)
        result["llmlab_wall_s"] = round(time.perf_counter() - t, 1)
        summary = json.loads((Path(tmp) / "run" / "summary.json").read_text())
        result["llmlab"] = {k: summary[k] for k in ("tokens_per_s", "tokens_per_s_mean", "mfu", "params",
                                                      "flops_per_token", "train_loss", "val_loss", "precision")}
        result["llmlab"]["peak_mem_gb"] = max(
            (r.get("perf/mem_gb", 0) for r in map(json.loads, (Path(tmp) / "run" / "metrics.jsonl").open())),
            default=None)
        os.environ["LLMLAB_CACHE"] = env["LLMLAB_CACHE"]
        from llmlab.data.prepare import prepare
        cfg = train_config(overrides)
        prepared = prepare(cfg["data"], cfg["tokenizer"], None)
        result.update(flash_check(cfg, prepared.vocab_size, args.batch_size))
        if not args.skip_plain:
            from bench.plain import train_plain
            vocab = -(-prepared.vocab_size // 64) * 64
            plain = train_plain(prepared.tokens("train"), vocab, 768, 12, 12, 1024, args.batch_size, args.steps,
                                lr=6e-4, warmup=20, min_lr=6e-5, device="cuda", precision="bf16",
                                compile=not args.no_compile)
            plain.pop("model")
            result["plain"] = plain
            result["llmlab_vs_plain"] = summary["tokens_per_s"] / plain["tokens_per_s"]
    print(json.dumps(result, indent=2))
    path = write_result(f"gpu_gpt2_bs{args.batch_size}{'_nocompile' if args.no_compile else ''}", result)
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / path.name).write_text(path.read_text())


if __name__ == "__main__":
    main()
