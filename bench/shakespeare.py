"""nanoGPT's shakespeare-char CPU configuration, through ``llmlab train``, beside a minimal
plain-PyTorch loop (bench/plain.py) on the same tokens and, given a nanoGPT checkout, nanoGPT's
own ``train.py``: alternating rounds in one run, each round in a rotated order, so that every
ratio compares runs made under the same load.

    python -m bench.shakespeare --data ../shared/data/tinyshakespeare.txt [--steps 2000]
    python -m bench.shakespeare --data ... --nanogpt path/to/nanoGPT --rounds 4
    python -m bench.shakespeare --data ... --nanogpt path/to/nanoGPT --rounds 6 --time-to-loss

The gpt2 preset at 4 layers, 4 heads, d 128, context 64, batch 12, no biases in its linear
layers (as nanoGPT), byte tokens (one per
character), AdamW (beta2 0.99) at lr 1e-3 with 100 warmup steps and cosine decay to 1e-4, no dropout.
nanoGPT runs as its README's CPU line gives it (``--device=cpu --compile=False --eval_iters=20
--log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128
--max_iters=<steps> --lr_decay_iters=<steps> --dropout=0.0``) on its own character data, which
this script writes as its ``prepare.py`` does (sorted characters, the first 90% for training).
Its tokens/s is the median of its per-iteration times, without the iterations that evaluate. Its
validation loss is its final weights' mean loss over every window of its val split, as the plain
loop's is scored (its own 20-batch estimate is kept beside it).
Where the CPU multiplies bf16 in hardware (AVX-512 BF16, AMX; or ``--bf16``), each round also
runs llmlab with ``precision=bf16``, the same recipe with its matmuls in bf16, and the plain loop
under the same autocast (nanoGPT's train.py autocasts on CUDA only).
Time to nanoGPT's loss: given a nanoGPT checkout, each round also runs llmlab's fast recipe
(``FAST``: the default model and optimiser, Muon, at nanoGPT's shape, warm-up-stable-decay with
a cooldown over the last 40%, ``FAST_STEPS`` steps), scored the same way, and times both commands' wall clocks as a user meets them (start-up
and evaluation included; the data prepared beforehand for both). ``time_to_loss_ratio`` is the
median over the rounds of the recipe's time over nanoGPT's, where the recipe's validation loss is
at or below nanoGPT's at its last step. ``--time-to-loss`` runs only those two, alternating, and
keeps the rest of bench/results/shakespeare.json as it was.
Targets:
  - the recipe reaches nanoGPT's loss at step 2000 in <= 0.4x its time;
  - llmlab's tokens/s >= the plain loop's, and >= 1.1x nanoGPT's (median of the rounds' ratios);
  - val loss <= nanoGPT's at step 2000;
  - a modern preset (llama: RoPE, RMSNorm, SwiGLU; tied, for the same parameter count) lower still;
  - CPU MFU against the measured fp32 matmul peak, here and at d_model 512 (target >= 55% there).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import child_env, llmlab, native_bf16, train_config, write_result

WIDTH, LAYERS, HEADS, BLOCK, BATCH = 128, 4, 4, 64, 12  # nanoGPT's CPU line: n_embd, n_layer, n_head, block, batch
SHAPE = [f"model.d_model={WIDTH}", f"model.n_layers={LAYERS}", f"model.n_heads={HEADS}", f"model.max_seq_len={BLOCK}",
         f"train.batch_size={BATCH}"]
# as nanoGPT's train.py: no biases in the linear layers (its LayerNorms have none either; llmlab's
# keep theirs). The byte vocabulary (257) is padded to 272, a multiple of the CPU's vector width,
# not to 320 (64, for GPUs' matrix units): the head is 4% of this model's FLOPs
MODEL = ["model.bias=false", "model.vocab_multiple=16"]
VOCAB_MULTIPLE = 16
# the fast recipe (docs/benchmarks.md): llmlab's default model (qk-norm GQA, SwiGLU, RoPE) and optimiser
# (Muon) at nanoGPT's shape and tokens, warm-up-stable-decay with a long cooldown, 300 steps
FAST = [*SHAPE, "model.vocab_multiple=16", "optim=muon", "sched=wsd", "sched.warmup=20", "sched.decay_fraction=0.4"]
FAST_STEPS = 300
RECIPE = ["tokenizer=byte", "optim=adamw", "optim.lr=1e-3", "optim.beta2=0.99", "sched=cosine", "sched.warmup=100", "sched.min_lr_ratio=0.1",
          "train.log_every=10", "train.eval_every=0", "train.eval_windows=0", "train.ckpt_every=0",
          "train.prompts=[]", "logger=none"]


def llmlab_train(tmp: Path, env: dict, name: str, overrides: list[str]) -> dict:
    t = time.perf_counter()
    llmlab("shakespeare", ["train", f"hydra.run.dir={name}", *overrides], tmp, env)
    wall = time.perf_counter() - t
    s = json.loads((tmp / name / "summary.json").read_text())
    return {"overrides": overrides, "wall_s": round(wall, 1), "params": s["params"], "tokens_per_s": s["tokens_per_s"],
            "mfu": s["mfu"], "val_loss": s["val_loss"], "train_loss": s["train_loss"], "steps": s["steps"]}


NANOGPT_FILES = ("train.py", "model.py", "configurator.py", "config/train_shakespeare_char.py")
ITER_LINE = re.compile(r"^iter (\d+): loss ([\d.]+), time ([\d.]+)ms")
EVAL_LINE = re.compile(r"^step (\d+): train loss ([\d.]+), val loss ([\d.]+)")


def nanogpt_setup(checkout: Path, text: Path, work: Path) -> Path:
    """A copy of nanoGPT's training files with its character data beside them, written as its
    ``data/shakespeare_char/prepare.py`` writes it (which would download the text)."""
    for name in NANOGPT_FILES:
        if not (checkout / name).is_file():
            sys.exit(f"bench.shakespeare: --nanogpt {checkout}: no {name} there (a nanoGPT checkout has it)")
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(checkout / name, work / name)
    data = text.read_text()
    chars = sorted(set(data))
    index = {c: i for i, c in enumerate(chars)}
    out = work / "data" / "shakespeare_char"
    out.mkdir(parents=True, exist_ok=True)
    cut = int(len(data) * 0.9)
    for split, part in (("train", data[:cut]), ("val", data[cut:])):
        np.array([index[c] for c in part], dtype=np.uint16).tofile(out / f"{split}.bin")
    with open(out / "meta.pkl", "wb") as f:  # nanoGPT reads its vocabulary size from here
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": index}, f)
    return work


# nanoGPT's final weights scored by the plain loop's own scorer (bench/plain.py's eval_plain: the mean
# loss over every non-overlapping window of the val split), so that the three validation losses are one
# measure and not its 20-random-batch estimate. Run in nanoGPT's folder, with its model.py; argv: the
# context, this repository's root.
NANOGPT_EVAL = """
import json, sys
import numpy as np, torch
sys.path.insert(0, sys.argv[2])
from bench.plain import eval_plain
from model import GPT, GPTConfig
ckpt = torch.load("out-shakespeare-char/ckpt.pt", map_location="cpu", weights_only=True)
gpt = GPT(GPTConfig(**ckpt["model_args"]))
gpt.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()})

class Loss(torch.nn.Module):  # eval_plain's model(x, y) -> loss; nanoGPT's returns (logits, loss)
    def __init__(self):
        super().__init__()
        self.gpt = gpt
    def forward(self, x, y):
        return self.gpt(x, y.contiguous())[1]

val = np.fromfile("data/shakespeare_char/val.bin", dtype=np.uint16)
with torch.no_grad():
    loss = eval_plain(Loss(), val, int(sys.argv[1]), 64)
print(json.dumps({"val_loss": loss, "iter_num": int(ckpt["iter_num"]), "windows": (len(val) - 1) // int(sys.argv[1])}))
"""


def nanogpt_train(work: Path, steps: int) -> dict:
    # always_save_checkpoint: its config saves only when its estimate improves; the final weights are scored here
    args = ["config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--eval_iters=20", "--log_interval=1",
            f"--block_size={BLOCK}", f"--batch_size={BATCH}", f"--n_layer={LAYERS}", f"--n_head={HEADS}",
            f"--n_embd={WIDTH}", f"--max_iters={steps}", f"--lr_decay_iters={steps}", "--dropout=0.0",
            "--always_save_checkpoint=True"]
    every = 250 if steps % 250 == 0 else steps  # its config's eval_interval, or one at the end: the last step is saved
    if every != 250:
        args.append(f"--eval_interval={every}")
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "train.py", *args], cwd=work, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if done.returncode:
        sys.exit(f"bench.shakespeare: nanoGPT's train.py failed:\n{done.stdout[-1500:]}\n{done.stderr[-1500:]}")
    times, evals = [], []
    for line in done.stdout.splitlines():
        if m := ITER_LINE.match(line):
            step = int(m[1])
            if step >= 10 and step % every:  # its first steps and the steps that evaluate (and save) aside
                times.append(float(m[3]) / 1000)
        elif m := EVAL_LINE.match(line):
            evals.append((int(m[1]), float(m[3])))
    if not times:
        sys.exit(f"bench.shakespeare: nanoGPT printed no timed iterations in {steps} steps; give --steps 20 or more")
    scored = subprocess.run([sys.executable, "-c", NANOGPT_EVAL, str(BLOCK), str(Path(__file__).resolve().parents[1])],
                            cwd=work, capture_output=True, text=True)
    if scored.returncode:
        sys.exit(f"bench.shakespeare: scoring nanoGPT's checkpoint failed:\n{scored.stderr[-1500:]}")
    whole = json.loads(scored.stdout.strip().splitlines()[-1])
    if whole["iter_num"] != steps:
        sys.exit(f"bench.shakespeare: nanoGPT's checkpoint is of iteration {whole['iter_num']}, not {steps}")
    return {"command": "python train.py " + " ".join(args), "wall_s": round(wall, 1),
            "tokens_per_s": BATCH * BLOCK / statistics.median(times), "step_s_median": statistics.median(times),
            "val_loss": whole["val_loss"], "val_windows": whole["windows"],
            "val_loss_estimate": evals[-1][1] if evals else None, "val_loss_estimate_step": evals[-1][0] if evals else None,
            "val_loss_note": "val_loss: its weights at the last step over the whole val split, as the plain loop's; "
                             "val_loss_estimate: its own 20 random batches"}


def plain_train(prepared, steps: int, precision: str = "fp32") -> dict:
    from bench.plain import eval_plain, train_plain
    vocab = -(-prepared.vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE  # llmlab pads the embedding the same way
    t = time.perf_counter()
    plain = train_plain(prepared.tokens("train"), vocab, WIDTH, LAYERS, HEADS, BLOCK, BATCH, steps, lr=1e-3, warmup=100,
                        min_lr=1e-4, betas=(0.9, 0.99), bias=False, precision=precision)
    plain["wall_s"] = round(time.perf_counter() - t, 1)
    plain["val_loss"] = eval_plain(plain.pop("model"), prepared.tokens("val"), BLOCK, 64)
    return plain


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="../shared/data/tinyshakespeare.txt")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=1, help="alternating rounds of llmlab, the plain loop (and nanoGPT)")
    ap.add_argument("--nanogpt", type=Path, help="a nanoGPT checkout (github.com/karpathy/nanoGPT): time its train.py too")
    ap.add_argument("--mfu-steps", type=int, default=60)
    ap.add_argument("--time-to-loss", action="store_true",
                    help="only nanoGPT and llmlab's fast recipe, alternating (needs --nanogpt); the rest of the results file is kept")
    ap.add_argument("--fast-steps", type=int, default=FAST_STEPS, help="the fast recipe's train.steps")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                    help="also time llmlab with precision=bf16 (default: where the CPU has AVX-512 BF16 or AMX)")
    args = ap.parse_args()
    data = Path(args.data).resolve()
    if not data.is_file():
        sys.exit(f"bench.shakespeare: {data} not found; pass --data <tinyshakespeare.txt>")
    if args.time_to_loss and not args.nanogpt:
        sys.exit("bench.shakespeare: --time-to-loss times llmlab's recipe against nanoGPT: give --nanogpt <checkout>")
    data_args = ["data=text", f"data.paths=[{data}]", "data.val_fraction=0.1"]
    base = [*data_args, *RECIPE, f"train.steps={args.steps}"]
    fast = [*data_args, *FAST, *(o for o in RECIPE if not o.startswith(("optim", "sched"))), f"train.steps={args.fast_steps}"]
    result: dict = {"data": str(data), "steps": args.steps, "rounds": args.rounds}
    with tempfile.TemporaryDirectory(prefix="llmlab-bench-shakespeare-") as tmp_name:
        tmp = Path(tmp_name)
        env = child_env(LLMLAB_CACHE=str(tmp / "cache"))
        nano = nanogpt_setup(args.nanogpt.resolve(), data, tmp / "nanogpt") if args.nanogpt else None
        prepared = prepared_tokens(env["LLMLAB_CACHE"], base)  # into the cache llmlab's runs read
        runners = {} if args.time_to_loss else {
            "gpt2": lambda r: llmlab_train(tmp, env, f"gpt2-{r}", ["model=gpt2", *SHAPE, *MODEL, *base]),
            "plain": lambda r: plain_train(prepared, args.steps)}
        bf16 = args.bf16 if args.bf16 is not None else native_bf16()
        result["bf16"] = bf16
        if bf16 and not args.time_to_loss:  # the same recipe with the matmuls in bf16 (the attention core stays fp32 on CPUs)
            runners["gpt2_bf16"] = lambda r: llmlab_train(tmp, env, f"gpt2-bf16-{r}",
                                                          ["model=gpt2", *SHAPE, *MODEL, *base, "precision=bf16"])
            runners["plain_bf16"] = lambda r: plain_train(prepared, args.steps, "bf16")  # its yardstick, likewise
        if nano is not None:
            runners["nanogpt"] = lambda r: nanogpt_train(nano, args.steps)
            runners["fast"] = lambda r: llmlab_train(tmp, env, f"fast-{r}", fast)
        names = list(runners)
        rounds = []
        for r in range(args.rounds):
            # each goes first in turn, so that none always meets the same load
            order = names[r % len(names):] + names[:r % len(names)]
            done = {name: runners[name](r) for name in order}
            this = {name: done[name] for name in names}
            for run, tag, plain in (("gpt2", "llmlab", "plain"), ("gpt2_bf16", "llmlab_bf16", "plain_bf16")):
                if run in this:  # each against the plain loop in its own precision
                    this[f"{tag}_vs_plain"] = this[run]["tokens_per_s"] / this[plain]["tokens_per_s"]
                    if nano is not None:
                        this[f"{tag}_vs_nanogpt"] = this[run]["tokens_per_s"] / this["nanogpt"]["tokens_per_s"]
            if nano is not None:
                this["time_to_loss"] = time_to_loss(this["fast"], this["nanogpt"])
            print(f"round {r + 1}: " + ", ".join(f"{k} {v['tokens_per_s']:,.0f} tok/s, {v['wall_s']:.1f} s, val {v['val_loss']:.4f}"
                                                  for k, v in this.items() if isinstance(v, dict) and "tokens_per_s" in v))
            rounds.append(this)
        if nano is not None:
            result["time_to_loss"] = time_to_loss_summary(rounds, fast, args.steps)
            result["time_to_loss_ratio"] = result["time_to_loss"]["ratio"]
            t = result["time_to_loss"]
            print(f"time to nanoGPT's loss at step {args.steps}: llmlab's fast recipe at {t['ratio']:.2f}x nanoGPT's time "
                  f"(rounds {t['ratios']}), val loss {t['llmlab_val_loss']:.4f} against {t['nanogpt_val_loss']:.4f}"
                  + ("" if t["reached_every_round"] else "; NOT reached in every round"))
        if args.time_to_loss:
            keep_rest("shakespeare", result)
            return
        result["rounds_detail"] = rounds
        for key in ("gpt2", "gpt2_bf16", "plain", "plain_bf16", "nanogpt"):
            if key in rounds[0]:
                result[key] = {**rounds[-1][key], "tokens_per_s": statistics.median(x[key]["tokens_per_s"] for x in rounds),
                               "tokens_per_s_rounds": [round(x[key]["tokens_per_s"]) for x in rounds],
                               "val_loss_rounds": [x[key]["val_loss"] for x in rounds]}
        for key in ("llmlab_vs_plain", "llmlab_vs_nanogpt", "llmlab_bf16_vs_plain", "llmlab_bf16_vs_nanogpt"):
            if key in rounds[0]:
                result[key] = statistics.median(x[key] for x in rounds)
                result[key + "_rounds"] = [round(x[key], 3) for x in rounds]
        result["llama"] = llmlab_train(tmp, env, "llama", ["model=llama", "model.tie_embeddings=true", *SHAPE, *base])
        result["mfu_d512"] = llmlab_train(
            tmp, env, "d512", ["model=gpt2", *SHAPE, "model.d_model=512", *data_args, *RECIPE,
                               f"train.steps={args.mfu_steps}", "train.eval_windows=1"])
    g, p, m = result["gpt2"], result["plain"], result["llama"]
    print(f"shakespeare-char, {args.steps} steps, {args.rounds} round(s), medians: llmlab gpt2 "
          f"{g['tokens_per_s']:,.0f} tok/s (MFU {g['mfu']:.1%}), plain loop {p['tokens_per_s']:,.0f} tok/s: "
          f"llmlab at {result['llmlab_vs_plain']:.1%} of plain")
    if "nanogpt" in result:
        n = result["nanogpt"]
        print(f"nanoGPT {n['tokens_per_s']:,.0f} tok/s: llmlab at {result['llmlab_vs_nanogpt']:.2f}x "
              f"(rounds {result['llmlab_vs_nanogpt_rounds']}); nanoGPT val loss {n['val_loss']:.4f} (whole split; "
              f"its estimate {n['val_loss_estimate']})")
    if "gpt2_bf16" in result:
        b = result["gpt2_bf16"]
        print(f"precision=bf16: llmlab {b['tokens_per_s']:,.0f} tok/s, {result['llmlab_bf16_vs_plain']:.2f}x the plain loop's "
              f"{result['plain_bf16']['tokens_per_s']:,.0f} in bf16 (val loss {result['plain_bf16']['val_loss']:.4f})"
              + (f", {result['llmlab_bf16_vs_nanogpt']:.2f}x nanoGPT (rounds {result['llmlab_bf16_vs_nanogpt_rounds']})"
                 if "llmlab_bf16_vs_nanogpt" in result else "") + f"; val loss {b['val_loss']:.4f}")
    print(f"val loss: gpt2 {g['val_loss']:.4f} ({g['params']:,} params), plain {p['val_loss']:.4f}, "
          f"llama {m['val_loss']:.4f} ({m['params']:,} params)")
    print(f"CPU MFU at d_model 512: {result['mfu_d512']['mfu']:.1%} ({result['mfu_d512']['tokens_per_s']:,.0f} tok/s)")
    write_result("shakespeare", result)


def time_to_loss(fast: dict, nano: dict) -> dict:
    """One round: the recipe's wall time over nanoGPT's, and whether it reached nanoGPT's loss."""
    return {"ratio": fast["wall_s"] / nano["wall_s"], "reached": fast["val_loss"] <= nano["val_loss"],
            "llmlab_wall_s": fast["wall_s"], "llmlab_val_loss": fast["val_loss"],
            "nanogpt_wall_s": nano["wall_s"], "nanogpt_val_loss": nano["val_loss"]}


def time_to_loss_summary(rounds: list[dict], fast: list[str], steps: int) -> dict:
    """The rounds' time-to-loss figures: the median ratio, each round's, and the losses."""
    per = [r["time_to_loss"] for r in rounds]
    return {"target": f"nanoGPT's validation loss at its step {steps} (its final weights, the whole val split)",
            "command": "llmlab train " + " ".join(fast), "nanogpt_command": rounds[-1]["nanogpt"]["command"],
            "ratio": statistics.median(p["ratio"] for p in per), "ratios": [round(p["ratio"], 3) for p in per],
            "reached_every_round": all(p["reached"] for p in per),
            "llmlab_val_loss": per[-1]["llmlab_val_loss"], "nanogpt_val_loss": per[-1]["nanogpt_val_loss"],
            "llmlab_wall_s": [p["llmlab_wall_s"] for p in per], "nanogpt_wall_s": [p["nanogpt_wall_s"] for p in per],
            "llmlab_tokens_per_s": [round(r["fast"]["tokens_per_s"]) for r in rounds],
            "nanogpt_tokens_per_s": [round(r["nanogpt"]["tokens_per_s"]) for r in rounds], "rounds": per}


def keep_rest(name: str, result: dict) -> None:
    """Write ``result``'s time-to-loss figures into bench/results/NAME.json, keeping what the
    last full run wrote there; they carry their own date and machine."""
    from bench.common import RESULTS, machine
    from llmlab.files import atomic_write_text

    path = RESULTS / f"{name}.json"
    try:
        old = json.loads(path.read_text()) if path.is_file() else {"benchmark": name}
    except (OSError, ValueError) as e:
        old = None
        why = f"{type(e).__name__}: {e}"
    if not isinstance(old, dict):  # hand-edited or cut short: said, and nothing written over it
        sys.exit(f"bench.shakespeare: {path} is not a results object ({why if old is None else type(old).__name__}); "
                 "move it aside to keep it, or run without --time-to-loss to write it anew")
    old["time_to_loss"] = {**result["time_to_loss"], "date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine()}
    old["time_to_loss_ratio"] = result["time_to_loss_ratio"]
    atomic_write_text(path, json.dumps(old, indent=2) + "\n")
    print(f"wrote {path} (time_to_loss, time_to_loss_ratio; the rest as it was)")


def prepared_tokens(cache: str, overrides: list[str]):
    os.environ["LLMLAB_CACHE"] = cache
    from llmlab.data.prepare import prepare
    cfg = train_config(["model=gpt2", *SHAPE, *MODEL, *overrides])
    return prepare(cfg["data"], cfg["tokenizer"], None)


if __name__ == "__main__":
    main()
