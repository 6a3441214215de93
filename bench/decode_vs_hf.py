"""Decoding against Hugging Face ``transformers`` on the very same weights.

    python -m bench.decode_vs_hf [--sizes 1.7M,3.1M,9.7M,22.9M] [--tokens 256] [--rounds 2]
                                 [--steps 40] [--device cpu] [--precision fp32] [--keep DIR]
    python -m bench.decode_vs_hf --gpt2 --device cuda --precision bf16     # GPT-2-124M, on a GPU

Each size is a llama-family model (RoPE, RMSNorm, SwiGLU, GQA, the byte tokenizer; ``--gpt2``:
GPT-2-124M with a 50,257-token BPE) trained for a few steps by ``llmlab train`` on the stdlib
corpus (``--data``: a text file), then exported with ``llmlab export``.
Every round runs, each in a fresh process and in an order that rotates from round to round:
``llmlab sample`` greedy (the defaults, ``pack_weights=auto``), ``llmlab sample`` greedy with
``pack_weights=false`` (on a GPU instead: with ``cuda_graph=false``), ``transformers``
``generate`` greedy, then both sampling with the
same top-k/top-p/temperature. The prompt is "ROMEO:", batch 1, ``--tokens`` new tokens (no stop
at the end-of-text token). tokens/s is new tokens over the decoding's wall time, prefill
included, for both; time to first token is from the call to the first new token. The greedy
texts must be identical. ``transformers`` gets a short warm-up ``generate`` first, which
``llmlab sample`` does not. On the CPU, ``--num-samples N`` also times N samples of one prompt
decoded as one batch (as ``llmlab sample num_samples=N`` does) against one at a time. Results go to bench/results/decode_vs_hf[_<name>].json;
``transformers`` is an optional extra: without it the benchmark says so in one line and stops.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import child_env, tree_load, write_result
from llmlab.perf import contended

PROMPT = "ROMEO:"
# name -> (d_model, layers, heads); kv_heads 2 (model=llama's default)
SIZES = {"1.7M": (192, 4, 4), "3.1M": (256, 4, 4), "9.7M": (384, 6, 6), "22.9M": (512, 8, 8)}
GPT2 = ["model=gpt2", "model.d_model=768", "model.n_layers=12", "model.n_heads=12", "model.max_seq_len=1024",
        "tokenizer.vocab_size=50257"]
SAMPLING = {"temperature": 0.8, "top_k": 50, "top_p": 0.95}
TRAIN = ["optim=adamw", "logger=none", "train.eval_every=0", "train.eval_windows=8", "train.ckpt_every=0", "train.prompts=[]",
         "train.log_every=20", "train.sample_tokens=0", "train.batch_size=8"]


def hf_worker(args) -> None:
    """One ``generate`` in this process (after a warm-up); prints its figures as JSON."""
    import time

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.generation.streamers import BaseStreamer

    device = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    tok = AutoTokenizer.from_pretrained(args.hf_worker)
    model = AutoModelForCausalLM.from_pretrained(args.hf_worker, dtype=dtype).to(device).eval()
    ids = tok(PROMPT, return_tensors="pt").input_ids.to(device)
    sampling = json.loads(args.sampling)
    options = {"do_sample": bool(sampling), **sampling, "attention_mask": torch.ones_like(ids),
               "pad_token_id": tok.eos_token_id}
    if not sampling:
        options.update(top_k=None, top_p=None, temperature=None)

    class FirstToken(BaseStreamer):
        def __init__(self):
            self.calls = 0
            self.first = None

        def put(self, value):
            self.calls += 1
            if self.calls == 2 and self.first is None:  # the first put is the prompt
                if device.type == "cuda":
                    torch.cuda.synchronize()
                self.first = time.perf_counter()

        def end(self):
            pass

    with torch.inference_mode():
        model.generate(ids, max_new_tokens=8, min_new_tokens=8, **options)
        torch.manual_seed(args.seed)
        streamer = FirstToken()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=args.tokens, min_new_tokens=args.tokens, streamer=streamer,
                             **options)
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
    new = out[0, ids.shape[1]:]
    print(json.dumps({"tokens_per_s": len(new) / elapsed, "first_token_s": streamer.first - t0,
                      "new_tokens": len(new), "text": tok.decode(new, skip_special_tokens=True),
                      "torch_threads": torch.get_num_threads()}))


def run(cmd: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"bench.decode_vs_hf: {' '.join(cmd[2:5])} failed:\n{proc.stderr[-3000:]}")
    return proc


def llmlab_sample(run_dir: Path, out_dir: Path, env: dict, args, extra: list[str]) -> dict:
    """One ``llmlab sample``; its figures from the samples.jsonl it keeps."""
    run([sys.executable, "-m", "llmlab", "sample", f"ckpt={run_dir}", f"prompt={PROMPT}",
         f"max_new_tokens={args.tokens}", "stop_at_eos=false", f"device={args.device}",
         f"precision={args.precision}", f"hydra.run.dir={out_dir}", *extra], env, out_dir.parent)
    lines = [json.loads(line) for line in (out_dir / "samples.jsonl").read_text().splitlines()]
    stats = lines[-1]["stats"]
    return {"tokens_per_s": stats["tokens_per_s"], "first_token_s": stats["first_token_s"],
            "new_tokens": stats["new_tokens"], "threads": stats.get("threads"), "text": lines[-2]["completion"]}


def hf_generate(export_dir: Path, env: dict, args, sampling: dict, cwd: Path) -> dict:
    proc = run([sys.executable, "-m", "bench.decode_vs_hf", "--hf-worker", str(export_dir),
                f"--tokens={args.tokens}", f"--device={args.device}", f"--precision={args.precision}",
                f"--sampling={json.dumps(sampling)}"], env, cwd)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_size(name: str, shape: list[str], tmp: Path, env: dict, args) -> dict:
    run_dir, export_dir = tmp / name, tmp / f"{name}-hf"
    if not (run_dir / "summary.json").is_file():
        run([sys.executable, "-m", "llmlab", "train", f"hydra.run.dir={run_dir}", *TRAIN, *shape,
             f"train.steps={args.steps}", f"device={args.device}", f"precision={args.precision}"], env, tmp)
    if not (export_dir / "config.json").is_file():
        run([sys.executable, "-m", "llmlab", "export", f"ckpt={run_dir}", f"out={export_dir}",
             f"hydra.run.dir={tmp / (name + '-export')}"], env, tmp)
    params = json.loads((export_dir / "config.json").read_text())
    sampled = [f"{k}={v}" for k, v in SAMPLING.items()]
    modes = {
        "llmlab": lambda i: llmlab_sample(run_dir, tmp / f"{name}-s{i}-auto", env, args, ["temperature=0"]),
        "llmlab_unpacked": lambda i: llmlab_sample(run_dir, tmp / f"{name}-s{i}-plain", env, args,
                                                   ["temperature=0", "pack_weights=false"]),
        "transformers": lambda i: hf_generate(export_dir, env, args, {}, tmp),
        "llmlab_sampling": lambda i: llmlab_sample(run_dir, tmp / f"{name}-s{i}-top", env, args, sampled),
        "transformers_sampling": lambda i: hf_generate(export_dir, env, args, SAMPLING, tmp),
    }
    if args.device != "cpu":
        del modes["llmlab_unpacked"]  # packing is a CPU matter
        modes["llmlab_no_graph"] = lambda i: llmlab_sample(run_dir, tmp / f"{name}-s{i}-nograph", env, args,
                                                           ["temperature=0", "cuda_graph=false"])
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    order = list(modes)
    for i in range(args.rounds):
        for m in order[i % len(order):] + order[:i % len(order)]:  # who goes first rotates
            with tree_load() as load:
                runs[m].append(modes[m](i))
            runs[m][-1]["other_load"] = load["other_load"]
            print(f"{name} round {i + 1} {m}: {runs[m][-1]['tokens_per_s']:,.1f} tokens/s"
                  + (f" (other load {load['other_load']:.0%})" if load["other_load"] is not None else ""), flush=True)
    texts = {m: {r["text"] for r in rs} for m, rs in runs.items() if "sampling" not in m}
    greedy = set().union(*texts.values())
    reference = runs["transformers"][0]["text"]
    row = {"shape": shape, "params": sum_params(run_dir), "hf_config": {k: params.get(k) for k in (
        "hidden_size", "n_embd", "num_hidden_layers", "n_layer", "vocab_size") if k in params},
           "identical_greedy_text": len(greedy) == 1}
    for m, rs in runs.items():
        row[m] = {"tokens_per_s": [r["tokens_per_s"] for r in rs],
                  "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in rs),
                  "first_token_ms_median": 1000 * statistics.median(r["first_token_s"] for r in rs),
                  "other_load": [None if r["other_load"] is None else round(r["other_load"], 3) for r in rs]}
    loads = [r["other_load"] for rs in runs.values() for r in rs]
    row["runs"], row["contended_runs"] = len(loads), sum(contended(x) for x in loads)  # other work took > 15% of the CPU
    row["greedy_vs_transformers"] = row["llmlab"]["tokens_per_s_median"] / row["transformers"]["tokens_per_s_median"]
    row["sampling_vs_transformers"] = (row["llmlab_sampling"]["tokens_per_s_median"]
                                       / row["transformers_sampling"]["tokens_per_s_median"])
    if "llmlab_no_graph" in row:
        row["graph_vs_no_graph"] = (row["llmlab"]["tokens_per_s_median"]
                                    / row["llmlab_no_graph"]["tokens_per_s_median"])
    if "llmlab_unpacked" in row:
        row["auto_vs_unpacked"] = row["llmlab"]["tokens_per_s_median"] / row["llmlab_unpacked"]["tokens_per_s_median"]
    if args.device == "cpu" and args.num_samples > 1:
        row["num_samples"] = batched_samples(run_dir, args.num_samples, args.tokens, max(2, args.rounds))
    if not row["identical_greedy_text"]:
        # where each greedy text parts from transformers' (a barely trained model has near-ties
        # that a different summation order can flip)
        row["greedy_parts_at_char"] = {m: sorted({next((i for i, (a, b) in enumerate(zip(t, reference)) if a != b),
                                                       min(len(t), len(reference))) for t in ts if t != reference})
                                       for m, ts in texts.items()}
    return row


def batched_samples(run_dir: Path, n: int, tokens: int, rounds: int) -> dict:
    """``num_samples=n``: the n samples of one prompt decoded as one batch (what ``llmlab sample``
    does) against one at a time, in this process, alternating; tokens/s of each."""
    import time

    import torch

    from llmlab.sample.generate import SamplingConfig, generate
    from llmlab.train.checkpoint import build_model, load_checkpoint

    ckpt = load_checkpoint(run_dir)
    model = build_model(ckpt, torch.device("cpu"))
    prompt = torch.tensor([ckpt.tokenizer().encode(PROMPT)])
    cfg = SamplingConfig(max_new_tokens=tokens, **SAMPLING)
    generate(model, prompt, SamplingConfig(max_new_tokens=8, temperature=0.0))  # warm-up (packing choices)
    rates: dict[str, list[float]] = {"batched": [], "one_at_a_time": []}
    for i in range(rounds):
        for how in (["batched", "one_at_a_time"] if i % 2 == 0 else ["one_at_a_time", "batched"]):
            gen = torch.Generator().manual_seed(i)
            t = time.perf_counter()
            if how == "batched":
                generate(model, prompt.repeat(n, 1), cfg, generator=gen)
            else:
                for _ in range(n):
                    generate(model, prompt, cfg, generator=gen)
            rates[how].append(n * tokens / (time.perf_counter() - t))
    out = {how: statistics.median(r) for how, r in rates.items()}
    return {"n": n, "tokens_per_s": out, "speedup": out["batched"] / out["one_at_a_time"]}


def sum_params(run_dir: Path) -> int | None:
    card = run_dir / "summary.json"
    summary = json.loads(card.read_text()) if card.is_file() else {}
    return (summary.get("params") or {}).get("total") if isinstance(summary.get("params"), dict) else summary.get("params")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--gpt2", action="store_true", help="GPT-2-124M instead of the llama sizes")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--num-samples", type=int, default=4, help="also time num_samples=N batched against one at a "
                    "time (CPU; 1: skip)")
    ap.add_argument("--data", default=None, help="a text file to train on (default: the stdlib corpus)")
    ap.add_argument("--keep", default=None, help="keep the trained runs here (and reuse those it holds)")
    ap.add_argument("--name", default=None, help="results file: bench/results/decode_vs_hf[_NAME].json")
    ap.add_argument("--hf-worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--sampling", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hf_worker:
        return hf_worker(args)
    try:
        import transformers
    except ImportError:
        print("bench.decode_vs_hf: skipped, transformers is not installed (pip install transformers)")
        return
    repo = Path(__file__).resolve().parent.parent
    env = child_env(LLMLAB_CACHE=os.environ.get("LLMLAB_CACHE", str(repo / ".cache" / "llmlab")))
    if args.gpt2:
        shapes = {"gpt2-124M": GPT2}
    else:
        shapes = {}
        for name in args.sizes.split(","):
            if name not in SIZES:
                sys.exit(f"--sizes: unknown {name!r}; allowed: {', '.join(SIZES)}")
            d, layers, heads = SIZES[name]
            shapes[name] = ["model=llama", "tokenizer=byte", f"model.d_model={d}", f"model.n_layers={layers}",
                            f"model.n_heads={heads}"]
    if args.data:
        data = Path(args.data).expanduser().resolve()
        if not data.is_file():
            sys.exit(f"--data: {data} not found")
        shapes = {name: [*shape, "data=text", f"data.paths=[{data}]"] for name, shape in shapes.items()}
    result: dict = {"prompt": PROMPT, "tokens": args.tokens, "rounds": args.rounds, "device": args.device,
                    "precision": args.precision, "sampling": SAMPLING, "transformers": transformers.__version__,
                    "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="llmlab-bench-decode-") as tmp_name:
        tmp = Path(args.keep).resolve() if args.keep else Path(tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        for name, shape in shapes.items():
            result["sizes"][name] = measure_size(name, shape, tmp, env, args)
    out = write_result("decode_vs_hf" + (f"_{args.name}" if args.name else ""), result)
    for name, row in result["sizes"].items():
        print(f"{name}: llmlab {row['llmlab']['tokens_per_s_median']:,.0f} tokens/s, transformers "
              f"{row['transformers']['tokens_per_s_median']:,.0f} ({row['greedy_vs_transformers']:.2f}x); sampling "
              f"{row['sampling_vs_transformers']:.2f}x; identical greedy text: {row['identical_greedy_text']}"
              + (f"; {row['contended_runs']} of {row['runs']} runs under contention (other work took over 15% of "
                 "the CPU)" if row["contended_runs"] else "")
              + (f"; num_samples={row['num_samples']['n']} batched {row['num_samples']['speedup']:.2f}x one at a time"
                 if "num_samples" in row else ""))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
