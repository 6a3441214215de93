"""The default `llmlab train`, timed end to end, with its validation bits per byte beside
`xz -9` on the same validation split.

    python -m bench.train_default [--overrides key=value ...]
    python -m bench.train_default --overrides <a new recipe> --reference    # beside today's defaults
    python -m bench.train_default --overrides <a new recipe> --reference --name train_recipe   # its own file

Both recipes' settings are checked first (``llmlab train --cfg job``), then the data is
prepared, outside the runs' times. With ``--reference [key=value ...]`` a
second recipe trains after the first on the same machine, and the result carries both, the
ratio of their training times and the difference of their bits per byte.
Targets: the default run finishes in <= 10 minutes on 2 CPU cores; a new default recipe
reaches the reference's bits per byte (or better) in at most half its training time.
"""

from __future__ import annotations

import argparse
import functools
import json
import lzma
import tempfile
import time
from pathlib import Path

from bench import common
from bench.common import child_env, write_result
from llmlab.data.corpus import CORPUS


def xz_bits_per_byte(data_section: dict) -> dict:
    """xz -9 (LZMA2, preset 9) over the concatenated validation documents."""
    val = CORPUS.build(CORPUS.config(data_section, "data")).stream("val")
    raw = b"".join(d.text.encode("utf-8", "surrogateescape") for d in val)
    packed = lzma.compress(raw, format=lzma.FORMAT_XZ, preset=9)
    return {"xz9_bpb": 8 * len(packed) / len(raw), "val_bytes": len(raw)}


llmlab = functools.partial(common.llmlab, "train_default")


def one_run(tmp: Path, env: dict, name: str, overrides: list[str]) -> dict:
    """``llmlab train`` with ``overrides`` (data already prepared), then ``llmlab eval`` of its
    checkpoint on the whole validation split."""
    t = time.perf_counter()
    llmlab(["train", "logger=none", f"hydra.run.dir={name}", *overrides], tmp, env)
    wall = time.perf_counter() - t
    summary = json.loads((tmp / name / "summary.json").read_text())
    t = time.perf_counter()
    llmlab(["eval", f"ckpt={name}", f"hydra.run.dir={name}-eval"], tmp, env)
    eval_s = time.perf_counter() - t
    full = json.loads((tmp / f"{name}-eval" / "eval.json").read_text())
    result = {"command": "llmlab train " + " ".join(["logger=none", *overrides]), "wall_s": round(wall, 1),
              "train_elapsed_s": summary["elapsed_s"], "steps": summary["steps"], "tokens": summary["tokens"],
              "tokens_per_s": summary["tokens_per_s"], "tokens_per_s_other_load": summary.get("tokens_per_s_other_load"),
              "mfu": summary["mfu"], "params": summary["params"], "val_loss_periodic": summary["val_loss"],
              "val_loss_full": full["loss"], "val_bpb_full": full["bpb"], "eval_s": round(eval_s, 1)}
    print(f"{name}: {wall:.0f} s wall, {summary['elapsed_s']:.0f} s training ({summary['tokens_per_s']:,.0f} tok/s, "
          f"MFU {summary['mfu']:.1%}); full val loss {full['loss']:.3f} = {full['bpb']:.3f} bits/byte")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--overrides", nargs="*", default=[])
    ap.add_argument("--reference", nargs="*", metavar="KEY=VALUE",
                    help="also train this recipe (overrides of today's defaults; none: the defaults as they are), "
                    "after the data is prepared and in turn with the run above, and compare the two")
    ap.add_argument("--name", default="train_default",
                    help="the result's file in bench/results (a candidate's figures beside the default's own)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmlab-bench-train-") as tmp:
        tmp = Path(tmp)
        env = child_env(LLMLAB_CACHE=str(tmp / "cache"))
        recipes = [args.overrides, *([args.reference] if args.reference is not None else [])]
        for words in recipes:  # a mistyped key or value stops here, in a second, not after the data is prepared
            llmlab(["train", "--cfg", "job", "logger=none", *words], tmp, env, quiet=True)
        t = time.perf_counter()
        data = {tuple(w for w in words if w.startswith(("data", "tokenizer")))
                for words in recipes}
        for i, words in enumerate(sorted(data)):  # the data of each, before and outside either run's time
            llmlab(["tokenize", f"hydra.run.dir=tokenize-{i}", *words], tmp, env)
        prepare_s = time.perf_counter() - t
        runs = {"default": one_run(tmp, env, "default", args.overrides)}
        if args.reference is not None:
            runs["reference"] = one_run(tmp, env, "reference", args.reference)
    xz = xz_bits_per_byte({"kind": "pysource"})
    result = {**runs["default"], "target_wall_s": "<= 600", "prepare_s": round(prepare_s, 1), **xz}
    print(f"xz -9: {xz['xz9_bpb']:.3f} bits/byte")
    if "reference" in runs:
        ref, new = runs["reference"], runs["default"]
        result["reference"] = ref
        result["train_time_vs_reference"] = new["train_elapsed_s"] / ref["train_elapsed_s"]
        result["bpb_vs_reference"] = new["val_bpb_full"] - ref["val_bpb_full"]
        print(f"against the reference: {result['train_time_vs_reference']:.2f}x the training time, "
              f"{result['bpb_vs_reference']:+.3f} bits/byte (target: <= 0.5x, <= +0.000)")
    write_result(args.name, result)


if __name__ == "__main__":
    main()
