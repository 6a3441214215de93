"""nanoGPT's shakespeare-char CPU configuration, through ``llmlab train``, beside a minimal
plain-PyTorch loop (bench/plain.py) on the same tokens, timed in the same run.

    python -m bench.shakespeare --data ../shared/data/tinyshakespeare.txt [--steps 2000]

The gpt2 preset at 4 layers, 4 heads, d 128, context 64, batch 12, byte tokens (one per
character), AdamW (beta2 0.99) at lr 1e-3 with 100 warmup steps and cosine decay to 1e-4, no dropout.
Targets:
  - llmlab's tokens/s >= 95% of the plain loop's (framework overhead <= 5%);
  - val loss <= 1.88 nats/character at step 2000;
  - a modern preset (llama: RoPE, RMSNorm, SwiGLU; tied, for the same parameter count) lower still;
  - CPU MFU against the measured fp32 matmul peak, here and at d_model 512 (target >= 55% there).
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

from bench.common import write_result

SHAPE = ["model.d_model=128", "model.n_layers=4", "model.n_heads=4", "model.max_seq_len=64", "train.batch_size=12"]
RECIPE = ["tokenizer=byte", "optim.lr=1e-3", "optim.beta2=0.99", "sched=cosine", "sched.warmup=100", "sched.min_lr_ratio=0.1",
          "train.log_every=10", "train.eval_every=0", "train.eval_windows=0", "train.ckpt_every=0",
          "train.prompts=[]", "logger=none"]


def llmlab_train(tmp: Path, env: dict, name: str, overrides: list[str]) -> dict:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "llmlab", "train", f"hydra.run.dir={name}", *overrides], cwd=tmp, env=env,
                   check=True)
    wall = time.perf_counter() - t
    s = json.loads((tmp / name / "summary.json").read_text())
    return {"overrides": overrides, "wall_s": round(wall, 1), "params": s["params"], "tokens_per_s": s["tokens_per_s"],
            "mfu": s["mfu"], "val_loss": s["val_loss"], "train_loss": s["train_loss"], "steps": s["steps"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="../shared/data/tinyshakespeare.txt")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--mfu-steps", type=int, default=60)
    args = ap.parse_args()
    data = Path(args.data).resolve()
    if not data.is_file():
        sys.exit(f"bench.shakespeare: {data} not found; pass --data <tinyshakespeare.txt>")
    repo = Path(__file__).resolve().parent.parent
    data_args = ["data=text", f"data.paths=[{data}]", "data.val_fraction=0.1"]
    base = [*data_args, *RECIPE, f"train.steps={args.steps}"]
    result: dict = {"data": str(data), "steps": args.steps}
    with tempfile.TemporaryDirectory(prefix="llmlab-bench-shakespeare-") as tmp_name:
        tmp = Path(tmp_name)
        env = {**os.environ, "LLMLAB_CACHE": str(tmp / "cache"),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
        result["gpt2"] = llmlab_train(tmp, env, "gpt2", ["model=gpt2", *SHAPE, *base])

        os.environ["LLMLAB_CACHE"] = env["LLMLAB_CACHE"]  # the tokens llmlab prepared, from its cache
        from hydra import compose, initialize_config_dir
        from omegaconf import OmegaConf

        from bench.plain import eval_plain, train_plain
        from llmlab.paths import conf_dir
        from llmlab.data.prepare import prepare
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            cfg = OmegaConf.to_container(compose("train", ["model=gpt2", *SHAPE, *base]), resolve=True)
        prepared = prepare(cfg["data"], cfg["tokenizer"], None)
        vocab = -(-prepared.vocab_size // 64) * 64  # llmlab pads the embedding the same way
        t = time.perf_counter()
        plain = train_plain(prepared.tokens("train"), vocab, 128, 4, 4, 64, 12, args.steps, lr=1e-3, warmup=100,
                            min_lr=1e-4, betas=(0.9, 0.99))
        plain["wall_s"] = round(time.perf_counter() - t, 1)
        plain["val_loss"] = eval_plain(plain.pop("model"), prepared.tokens("val"), 64, 64)
        result["plain"] = plain
        result["llmlab_vs_plain"] = result["gpt2"]["tokens_per_s"] / plain["tokens_per_s"]

        result["llama"] = llmlab_train(tmp, env, "llama", ["model=llama", "model.tie_embeddings=true", *SHAPE, *base])
        result["mfu_d512"] = llmlab_train(
            tmp, env, "d512", ["model=gpt2", *SHAPE, "model.d_model=512", *data_args, *RECIPE,
                               f"train.steps={args.mfu_steps}", "train.eval_windows=1"])
    g, p, m = result["gpt2"], result["plain"], result["llama"]
    print(f"shakespeare-char, {args.steps} steps: llmlab gpt2 {g['tokens_per_s']:,.0f} tok/s (MFU {g['mfu']:.1%}), "
          f"plain loop {p['tokens_per_s']:,.0f} tok/s: llmlab at {result['llmlab_vs_plain']:.1%} of plain")
    print(f"val loss: gpt2 {g['val_loss']:.4f} ({g['params']:,} params), plain {p['val_loss']:.4f}, "
          f"llama {m['val_loss']:.4f} ({m['params']:,} params)")
    print(f"CPU MFU at d_model 512: {result['mfu_d512']['mfu']:.1%} ({result['mfu_d512']['tokens_per_s']:,.0f} tok/s)")
    write_result("shakespeare", result)


if __name__ == "__main__":
    main()
