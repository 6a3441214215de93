"""The default `llmlab train`, timed end to end, with its validation bits per byte beside
`xz -9` on the same validation split.

    python -m bench.train_default [--overrides key=value ...]
    python -m bench.train_default --overrides <a new recipe> --reference    # beside today's defaults
    python -m bench.train_default --overrides <a new recipe> --reference --name train_recipe   # its own file
    python -m bench.train_default --reference <the recipe before> --seeds 1337,1,2   # a pair per seed
    python -m bench.train_default --reference precision=fp32 --seeds 1337,1,2 --name precision_auto
        # on a CPU with bf16 units: precision=auto (bf16 there) against fp32, in seeded pairs

Both recipes' settings are checked first (``llmlab train --cfg job``), then the data is
prepared, outside the runs' times. With ``--reference [key=value ...]`` a
second recipe trains after the first on the same machine, and the result carries both, the
ratio of their training times and the difference of their bits per byte. With ``--seeds``
each seed is such a pair (the recipes in turn, a seed at a time), and the result adds the
seeds' bits per byte (mean, min, max) and the mean difference with its 95% interval: one
seed's difference can be smaller than the seeds' spread.
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
    # one scorer for every run: fp32, whatever precision the run trained in
    llmlab(["eval", f"ckpt={name}", f"hydra.run.dir={name}-eval", "precision=fp32"], tmp, env)
    eval_s = time.perf_counter() - t
    full = json.loads((tmp / f"{name}-eval" / "eval.json").read_text())
    result = {"command": "llmlab train " + " ".join(["logger=none", *overrides]), "wall_s": round(wall, 1),
              "train_elapsed_s": summary["elapsed_s"], "steps": summary["steps"], "tokens": summary["tokens"],
              "precision": summary.get("precision"), "device": summary.get("device"),
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
    ap.add_argument("--seeds", help="comma-separated seeds: a run of each recipe per seed (default: the recipes' own)")
    args = ap.parse_args()
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [None]
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
        pairs = []
        for seed in seeds:  # the recipes in turn, so that a slower stretch of the host falls on both
            seeded = [] if seed is None else [f"seed={seed}"]
            suffix = "" if seed is None else f"-seed{seed}"
            runs = {"default": one_run(tmp, env, f"default{suffix}", [*args.overrides, *seeded])}
            if args.reference is not None:
                runs["reference"] = one_run(tmp, env, f"reference{suffix}", [*args.reference, *seeded])
            pairs.append(runs)
    xz = xz_bits_per_byte({"kind": "pysource"})
    result = {**pairs[0]["default"], "target_wall_s": "<= 600", "prepare_s": round(prepare_s, 1), **xz}
    print(f"xz -9: {xz['xz9_bpb']:.3f} bits/byte")
    if args.reference is not None:
        for runs in pairs:
            ref, new = runs["reference"], runs["default"]
            runs["train_time_vs_reference"] = new["train_elapsed_s"] / ref["train_elapsed_s"]
            runs["bpb_vs_reference"] = new["val_bpb_full"] - ref["val_bpb_full"]
            print(f"against the reference: {runs['train_time_vs_reference']:.2f}x the training time, "
                  f"{runs['bpb_vs_reference']:+.4f} bits/byte (target: <= 0.5x, <= +0.000)")
        result.update(reference=pairs[0]["reference"], train_time_vs_reference=pairs[0]["train_time_vs_reference"],
                      bpb_vs_reference=pairs[0]["bpb_vs_reference"])
    if len(pairs) > 1:
        result["seeds"] = seeds
        result["pairs"] = pairs
        result["over_seeds"] = over_seeds(pairs)
        print(json.dumps(result["over_seeds"], indent=1))
    write_result(args.name, result)


def over_seeds(pairs: list[dict]) -> dict:
    """Each recipe's bits per byte over the seeds (mean, min, max), and with a reference, the
    training-time ratios' median and the mean paired difference of bits per byte with its 95%
    t-interval."""
    import statistics

    from scipy import stats

    out = {}
    for name in ("default", "reference"):
        bpb = [runs[name]["val_bpb_full"] for runs in pairs if name in runs]
        if bpb:
            out[name] = {"bpb_mean": statistics.fmean(bpb), "bpb_min": min(bpb), "bpb_max": max(bpb),
                         "train_elapsed_s_median": statistics.median(runs[name]["train_elapsed_s"] for runs in pairs)}
    if "reference" in pairs[0]:
        diffs = [runs["bpb_vs_reference"] for runs in pairs]
        mean = statistics.fmean(diffs)
        half = float(stats.t.ppf(0.975, len(diffs) - 1)) * statistics.stdev(diffs) / len(diffs) ** 0.5
        out["train_time_vs_reference_median"] = statistics.median(runs["train_time_vs_reference"] for runs in pairs)
        out["bpb_vs_reference_mean"] = mean
        out["bpb_vs_reference_95ci"] = [mean - half, mean + half]
    return out


if __name__ == "__main__":
    main()
