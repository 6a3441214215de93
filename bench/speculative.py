"""Speculative decoding on the CPU: a target and drafts of about a quarter of its size, all
trained by ``llmlab train`` on the stdlib corpus with the same tokenizer, greedy.

    python -m bench.speculative [--target-steps 300] [--draft-steps 300] [--distill-steps 300] [--k 4]
                                [--min-confidence 0.5 ...] [--draft-vocab 2048 ...] [--no-unpacked] [--keep DIR]

Two drafts of one shape: ``draft``, trained on the corpus, and ``distilled``, trained from the
target on the target's own greedy continuations (``distill.teacher=<target> distill.data=teacher``).
For each prompt, plain greedy decoding and speculative greedy decoding with each draft (as is,
and with ``spec.min_confidence`` at each --min-confidence) are timed (median of --repeats,
interleaved) and must give the same tokens. With --draft-vocab N, each draft is also timed
proposing only the N most frequent training tokens (``spec.draft_vocab``, ``name/vocabN``).
Decoding uses prepacked CPU weights, as ``llmlab sample`` does by default; with --unpacked (the
default) plain decoding and each draft are also timed without them (``name/unpacked``), each
speed-up against plain decoding of the same kind. Recorded: parameter counts and their ratio,
and per draft the acceptance rate, tokens per target forward, tokens/s and the speed-up (target
> 1.5x), and how often the draft's top token is the target's on the target's greedy text, by the
draft's confidence. Results go to bench/results/speculative.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import child_env, llmlab, write_result

PROMPTS = ["def ", "import os\nimport sys\n\n\n", "class Parser:\n    def __init__(self, ", "    for i in range(",
           "if __name__ == '__main__':\n", "        return self.", "    @property\n    def ", "try:\n    import "]
COMMON = ["optim=adamw", "logger=none", "train.eval_every=0", "train.eval_windows=8", "train.ckpt_every=0", "train.prompts=[]",
          "train.log_every=25", "model.max_seq_len=256", "train.batch_size=8", "optim.lr=2e-3"]


def train(tmp: Path, env: dict, name: str, shape: list[str], steps: int) -> Path:
    llmlab("speculative", ["train", f"hydra.run.dir={name}", *COMMON, *shape, f"train.steps={steps}"], tmp, env)
    return tmp / name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="model.d_model=512,model.n_layers=8,model.n_heads=8")
    ap.add_argument("--draft", default="model.d_model=384,model.n_layers=2,model.n_heads=6")
    ap.add_argument("--target-steps", type=int, default=300)
    ap.add_argument("--draft-steps", type=int, default=300)
    ap.add_argument("--distill-steps", type=int, default=300, help="steps of the distilled draft; 0 = skip it")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--min-confidence", type=float, nargs="*", default=[],
                    help="also measure each draft with spec.min_confidence at these thresholds")
    ap.add_argument("--draft-vocab", type=int, nargs="*", default=[],
                    help="also measure each draft proposing only the N most frequent training tokens")
    ap.add_argument("--unpacked", action=argparse.BooleanOptionalAction, default=True,
                    help="also time plain and speculative decoding without prepacked CPU weights (pack=False)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--keep", default=None, help="keep the trained runs in this directory; runs it already holds "
                    "finished (target/, draft/, distilled/) are measured without training again")
    args = ap.parse_args()
    repo = Path(__file__).resolve().parent.parent
    env = child_env(LLMLAB_CACHE=os.environ.get("LLMLAB_CACHE", str(repo / ".cache" / "llmlab")))
    with tempfile.TemporaryDirectory(prefix="llmlab-bench-spec-") as tmp_name:
        tmp = Path(args.keep).resolve() if args.keep else Path(tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        runs = {"target": (args.target.split(","), args.target_steps),
                "draft": (args.draft.split(","), args.draft_steps)}
        if args.distill_steps:
            runs["distilled"] = (args.draft.split(",") + ["distill.teacher=target", "distill.data=teacher"],
                                 args.distill_steps)
        for name, (shape, steps) in runs.items():
            if not (tmp / name / "summary.json").is_file():
                train(tmp, env, name, shape, steps)
        result = measure(tmp / "target", {name: tmp / name for name in runs if name != "target"}, args)
        result["train_wall_s"] = {name: json.loads((tmp / name / "summary.json").read_text())["wall_s"]
                                  for name in runs}
    out = write_result("speculative", result)
    print(json.dumps({k: v for k, v in result.items() if k != "prompts"}, indent=2))
    print(f"results: {out}")


def measure(target_dir: Path, draft_dirs: dict[str, Path], args) -> dict:
    import torch

    from llmlab.model.packing import chosen_linears
    from llmlab.sample.generate import SamplingConfig, generate
    from llmlab.sample.session import draft_shortlist
    from llmlab.sample.speculative import speculative_generate
    from llmlab.train.checkpoint import build_model, load_checkpoint

    torch.manual_seed(0)
    cpu = torch.device("cpu")
    tckpt = load_checkpoint(target_dir)
    target = build_model(tckpt, cpu)
    models = {name: build_model(load_checkpoint(d), cpu) for name, d in draft_dirs.items()}
    # each draft as is, and stopping a round at an unsure draft (spec.min_confidence); decoding
    # with prepacked CPU weights (the default, pack="auto"), and without them (name/unpacked)
    drafts = {name: (model, 0.0, "auto", None) for name, model in models.items()}
    drafts.update({f"{name}@{t:g}": (model, t, "auto", None) for name, model in models.items()
                   for t in args.min_confidence if t > 0})
    if args.draft_vocab:
        for name, model in models.items():  # the shortlist `llmlab sample spec.draft_vocab=N` uses
            dckpt = load_checkpoint(draft_dirs[name])
            drafts.update({f"{name}/vocab{n}": (model, 0.0, "auto", draft_shortlist(n, dckpt, tckpt))
                           for n in args.draft_vocab})
    plains = {"plain": "auto"}
    if args.unpacked:
        drafts.update({f"{name}/unpacked": (model, 0.0, False, None) for name, model in models.items()})
        plains["plain/unpacked"] = False
    tok = tckpt.tokenizer()
    cfg = SamplingConfig(max_new_tokens=args.new_tokens, temperature=0.0)
    rows, tokens_total, greedy = [], 0, []
    plain_totals = dict.fromkeys(plains, 0.0)
    totals = {name: {"s": 0.0, "proposed": 0, "accepted": 0, "forwards": 0} for name in drafts}
    with torch.inference_mode():
        for pack in plains.values():
            generate(target, torch.tensor([tok.encode("x = 1\n")]), SamplingConfig(max_new_tokens=8, temperature=0.0),
                     pack=pack)
        for prompt in PROMPTS:
            ids = tok.encode(prompt)
            times: dict[str, list[float]] = {name: [] for name in [*plains, *drafts]}
            stats = {}
            for _ in range(args.repeats):  # interleaved, so load on the machine hits all alike
                outs = []
                for name, pack in plains.items():
                    t = time.perf_counter()
                    outs.append(generate(target, torch.tensor([ids]), cfg, pack=pack)[0].tolist())
                    times[name].append(time.perf_counter() - t)
                plain = outs[0]
                for name, (draft, threshold, pack, shortlist) in drafts.items():
                    t = time.perf_counter()
                    spec, stats[name] = speculative_generate(target, ids, cfg, args.k, draft, min_confidence=threshold,
                                                             pack=pack, draft_vocab=shortlist)
                    times[name].append(time.perf_counter() - t)
                    outs.append(spec)
                if any(o != plain for o in outs):
                    raise SystemExit(f"bench.speculative: greedy outputs differ for prompt {prompt!r}")
            greedy.append((plain, len(ids)))
            new = len(plain) - len(ids)
            tokens_total += new
            plain_s = {name: statistics.median(times[name]) for name in plains}
            for name in plains:
                plain_totals[name] += plain_s[name]
            row = {"prompt": prompt, "new_tokens": new, **{f"{name}_s": round(v, 4) for name, v in plain_s.items()}}
            line = f"{prompt!r:42} plain {new / plain_s['plain']:6.1f} tok/s"
            for name, (_, _, pack, _) in drafts.items():
                s = statistics.median(times[name])
                p = plain_s["plain" if pack else "plain/unpacked"]
                total = totals[name]
                total["s"] += s
                total["proposed"] += stats[name].proposed
                total["accepted"] += stats[name].accepted
                total["forwards"] += stats[name].target_forwards
                row[name] = {"spec_s": round(s, 4), "speedup": round(p / s, 3),
                             "acceptance": round(stats[name].acceptance, 3)}
                line += f"  {name} x{p / s:.2f} ({stats[name].acceptance:.0%})"
            rows.append(row)
            print(line)
    tp = sum(p.numel() for p in target.parameters())
    with torch.no_grad():  # whether decoding packed the weights (it never does while autograd records)
        packs = {pack: len(chosen_linears([target], pack)) for pack in ("auto", False)}
    summary = lambda d: json.loads((d / "summary.json").read_text())  # noqa: E731
    result = {
        "device": "cpu", "threads": torch.get_num_threads(), "torch": torch.__version__, "k": args.k,
        "target": {"overrides": args.target, "steps": args.target_steps, "params": tp,
                   "val_loss": summary(target_dir)["val_loss"]},
        "new_tokens_per_prompt": args.new_tokens, "prompts": rows,
        "packed_layers": packs["auto"],
        "plain_tokens_per_s": tokens_total / plain_totals["plain"],
        **({"plain_unpacked_tokens_per_s": tokens_total / plain_totals["plain/unpacked"]} if args.unpacked else {}),
        "greedy_outputs_identical": True, "target_speedup": 1.5, "drafts": {},
    }
    for name, (model, threshold, pack, shortlist) in drafts.items():
        plain_total = plain_totals["plain" if pack else "plain/unpacked"]
        d = draft_dirs[name.split("@")[0].split("/")[0]]
        dp = sum(p.numel() for p in model.parameters())
        total, info = totals[name], summary(d)
        result["drafts"][name] = {
            "overrides": args.draft, "teacher": info.get("teacher"), "min_confidence": threshold,
            "draft_vocab": len(shortlist) if shortlist is not None else None,
            "packed_layers": packs[pack],
            "steps": args.distill_steps if info.get("teacher") else args.draft_steps, "params": dp,
            "draft_over_target_params": round(dp / tp, 3), "val_loss": info["val_loss"],
            "teacher_agreement": info.get("teacher_agreement"),
            "spec_tokens_per_s": tokens_total / total["s"], "speedup": plain_total / total["s"],
            "acceptance": total["accepted"] / max(1, total["proposed"]),
            "tokens_per_target_forward": tokens_total / max(1, total["forwards"]),
        }
        if threshold == 0 and pack and shortlist is None:
            result["drafts"][name]["on_target_greedy_text"] = agreement_by_confidence(model, greedy)
    return result


def agreement_by_confidence(model, greedy: list[tuple[list[int], int]]) -> dict:
    """How often the draft's top token is the target's next greedy token, teacher-forced on
    the target's greedy continuations, overall and by the draft's probability of its top token
    (the quantity ``spec.min_confidence`` thresholds)."""
    import torch

    conf, hit = [], []
    with torch.inference_mode():
        for seq, n in greedy:
            probs = model(torch.tensor([seq])).logits[0, n - 1:-1, :model.vocab_size].float().softmax(-1)
            c, top = probs.max(-1)
            conf.append(c)
            hit.append((top == torch.tensor(seq[n:])).float())
    conf, hit = torch.cat(conf), torch.cat(hit)
    out = {"agreement": round(float(hit.mean()), 4), "by_confidence": {}}
    for lo, hi in [(0.0, 0.1), (0.1, 0.3), (0.3, 0.5), (0.5, 1.0)]:
        m = (conf >= lo) & ((conf < hi) if hi < 1 else (conf <= hi))
        out["by_confidence"][f"{lo:g}-{hi:g}"] = {"share": round(float(m.float().mean()), 3),
                                                   "agreement": round(float(hit[m].mean()), 3) if m.any() else None}
    return out


if __name__ == "__main__":
    main()
