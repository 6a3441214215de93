"""Speculative decoding on the CPU: a target and a draft of about a quarter of its size, both
trained by ``llmlab train`` on the stdlib corpus with the same tokenizer, greedy.

    python -m bench.speculative [--target-steps 300] [--draft-steps 300] [--k 4]

For each prompt, plain greedy decoding and speculative greedy decoding of the same number of
tokens are timed (median of --repeats) and must give the same tokens. Recorded: parameter
counts and their ratio, acceptance rate, tokens per target forward, tokens/s of each, and the
speed-up (target > 1.5x). Results go to bench/results/speculative.json.
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

from bench.common import write_result

PROMPTS = ["def ", "import os\nimport sys\n\n\n", "class Parser:\n    def __init__(self, ", "    for i in range(",
           "if __name__ == '__main__':\n", "        return self.", "    @property\n    def ", "try:\n    import "]
COMMON = ["logger=none", "train.eval_every=0", "train.eval_windows=8", "train.ckpt_every=0", "train.prompts=[]",
          "train.log_every=25", "model.max_seq_len=256", "train.batch_size=8", "optim.lr=2e-3"]


def train(tmp: Path, env: dict, name: str, shape: list[str], steps: int) -> Path:
    subprocess.run([sys.executable, "-m", "llmlab", "train", f"hydra.run.dir={name}", *COMMON, *shape,
                    f"train.steps={steps}"], cwd=tmp, env=env, check=True)
    return tmp / name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="model.d_model=512,model.n_layers=8,model.n_heads=8")
    ap.add_argument("--draft", default="model.d_model=384,model.n_layers=2,model.n_heads=6")
    ap.add_argument("--target-steps", type=int, default=300)
    ap.add_argument("--draft-steps", type=int, default=300)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--keep", default=None, help="keep the two trained runs in this directory; when it already "
                    "holds finished target/ and draft/ runs, measure those without training")
    args = ap.parse_args()
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])),
           "LLMLAB_CACHE": os.environ.get("LLMLAB_CACHE", str(repo / ".cache" / "llmlab"))}
    with tempfile.TemporaryDirectory(prefix="llmlab-bench-spec-") as tmp_name:
        tmp = Path(args.keep).resolve() if args.keep else Path(tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        target_dir, draft_dir = tmp / "target", tmp / "draft"
        reuse = (target_dir / "summary.json").is_file() and (draft_dir / "summary.json").is_file()
        if not reuse:
            train(tmp, env, "target", args.target.split(","), args.target_steps)
            train(tmp, env, "draft", args.draft.split(","), args.draft_steps)
        train_s = json.loads((target_dir / "summary.json").read_text())["wall_s"] + \
            json.loads((draft_dir / "summary.json").read_text())["wall_s"] if reuse else time.perf_counter() - t0
        result = measure(target_dir, draft_dir, args)
        result["train_wall_s"] = round(train_s, 1)
    out = write_result("speculative", result)
    print(json.dumps({k: v for k, v in result.items() if k != "prompts"}, indent=2))
    print(f"results: {out}")


def measure(target_dir: Path, draft_dir: Path, args) -> dict:
    import torch

    from llmlab.sample.generate import SamplingConfig, generate
    from llmlab.sample.speculative import speculative_generate
    from llmlab.train.checkpoint import build_model, load_checkpoint

    torch.manual_seed(0)
    cpu = torch.device("cpu")
    tckpt, dckpt = load_checkpoint(target_dir), load_checkpoint(draft_dir)
    target, draft = build_model(tckpt, cpu), build_model(dckpt, cpu)
    tok = tckpt.tokenizer()
    cfg = SamplingConfig(max_new_tokens=args.new_tokens, temperature=0.0)
    rows, plain_total, spec_total, tokens_total, proposed, accepted, forwards = [], 0.0, 0.0, 0, 0, 0, 0
    with torch.inference_mode():
        generate(target, torch.tensor([tok.encode("x = 1\n")]), SamplingConfig(max_new_tokens=8, temperature=0.0))
        for prompt in PROMPTS:
            ids = tok.encode(prompt)
            plain_times, spec_times = [], []
            for _ in range(args.repeats):
                t = time.perf_counter()
                plain = generate(target, torch.tensor([ids]), cfg)[0].tolist()
                plain_times.append(time.perf_counter() - t)
                t = time.perf_counter()
                spec, stats = speculative_generate(target, ids, cfg, args.k, draft)
                spec_times.append(time.perf_counter() - t)
            if spec != plain:
                raise SystemExit(f"bench.speculative: greedy outputs differ for prompt {prompt!r}")
            new = len(plain) - len(ids)
            p, s = statistics.median(plain_times), statistics.median(spec_times)
            plain_total, spec_total, tokens_total = plain_total + p, spec_total + s, tokens_total + new
            proposed, accepted, forwards = proposed + stats.proposed, accepted + stats.accepted, \
                forwards + stats.target_forwards
            rows.append({"prompt": prompt, "new_tokens": new, "plain_s": round(p, 4), "spec_s": round(s, 4),
                         "speedup": round(p / s, 3), "acceptance": round(stats.acceptance, 3)})
            print(f"{prompt!r:42} plain {new / p:7.1f} tok/s  speculative {new / s:7.1f} tok/s  "
                  f"x{p / s:.2f}  acceptance {stats.acceptance:.0%}")
    tp = sum(p.numel() for p in target.parameters())
    dp = sum(p.numel() for p in draft.parameters())
    return {
        "device": "cpu", "threads": torch.get_num_threads(), "torch": torch.__version__, "k": args.k,
        "target": {"overrides": args.target, "steps": args.target_steps, "params": tp,
                   "val_loss": json.loads((target_dir / "summary.json").read_text())["val_loss"]},
        "draft": {"overrides": args.draft, "steps": args.draft_steps, "params": dp,
                  "val_loss": json.loads((draft_dir / "summary.json").read_text())["val_loss"]},
        "draft_over_target_params": round(dp / tp, 3),
        "new_tokens_per_prompt": args.new_tokens, "prompts": rows,
        "plain_tokens_per_s": tokens_total / plain_total, "spec_tokens_per_s": tokens_total / spec_total,
        "speedup": plain_total / spec_total, "acceptance": accepted / max(1, proposed),
        "tokens_per_target_forward": tokens_total / max(1, forwards), "greedy_outputs_identical": True,
        "target_speedup": 1.5,
    }


if __name__ == "__main__":
    main()
