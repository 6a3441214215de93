"""The default `llmlab train`, timed end to end, with its validation bits per byte beside
`xz -9` on the same validation split.

    python -m bench.train_default [--overrides key=value ...]

Target: the default run finishes in <= 10 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import lzma
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import child_env, write_result
from llmlab.data.corpus import CORPUS


def xz_bits_per_byte(data_section: dict) -> dict:
    """xz -9 (LZMA2, preset 9) over the concatenated validation documents."""
    val = CORPUS.build(CORPUS.config(data_section, "data")).stream("val")
    raw = b"".join(d.text.encode("utf-8", "surrogateescape") for d in val)
    packed = lzma.compress(raw, format=lzma.FORMAT_XZ, preset=9)
    return {"xz9_bpb": 8 * len(packed) / len(raw), "val_bytes": len(raw)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--overrides", nargs="*", default=[])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmlab-bench-train-") as tmp:
        env = child_env(LLMLAB_CACHE=str(Path(tmp) / "cache"))
        cmd = [sys.executable, "-m", "llmlab", "train", "logger=none", "hydra.run.dir=run", *args.overrides]
        t = time.perf_counter()
        subprocess.run(cmd, cwd=tmp, env=env, check=True)
        wall = time.perf_counter() - t
        summary = json.loads((Path(tmp) / "run" / "summary.json").read_text())
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "llmlab", "eval", "ckpt=run", "hydra.run.dir=ev"], cwd=tmp, env=env,
                       check=True)
        eval_s = time.perf_counter() - t
        full = json.loads((Path(tmp) / "ev" / "eval.json").read_text())
    xz = xz_bits_per_byte({"kind": "pysource"})
    result = {"command": "llmlab train " + " ".join(["logger=none", *args.overrides]), "target_wall_s": "<= 600",
              "wall_s": round(wall, 1), "train_elapsed_s": summary["elapsed_s"], "steps": summary["steps"],
              "tokens": summary["tokens"], "tokens_per_s": summary["tokens_per_s"], "mfu": summary["mfu"],
              "params": summary["params"], "val_loss_periodic": summary["val_loss"],
              "val_loss_full": full["loss"], "val_bpb_full": full["bpb"], "eval_s": round(eval_s, 1), **xz}
    print(f"default train: {wall:.0f} s wall ({summary['tokens_per_s']:,.0f} tok/s, MFU {summary['mfu']:.1%}); "
          f"full val loss {full['loss']:.3f} = {full['bpb']:.3f} bits/byte; xz -9: {xz['xz9_bpb']:.3f} bits/byte")
    write_result("train_default", result)


if __name__ == "__main__":
    main()
