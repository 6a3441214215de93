"""Where a GPT-2-124M training step spends its time on one CUDA GPU, and what a few changes
buy: the llmlab model, compiled, bf16 autocast, fused AdamW and clipping as ``llmlab train``
runs them, on random tokens (no data pipeline, no tokenizer).

    python -m bench.gpu_probe [--variants base,flash,bs64] [--steps 20] [--profile] [--name gpu_probe]

A variant's name lists its changes from the default path: ``cudnn`` or ``flash`` pins the
SDPA backend (left alone, SDPA picks cuDNN's fused attention on Hopper), ``bs64`` doubles the
micro-batch (``bsN``: N sequences), ``autotune`` compiles with max-autotune-no-cudagraphs, ``cdt`` turns on
inductor's coordinate-descent tuning of its generated kernels, ``plainloss`` computes the loss
from materialised logits instead of the fused `linear_cross_entropy` that ``llmlab train``
uses, ``cg`` compiles with mode="reduce-overhead" (CUDA graphs), ``mix`` (``nomix``) turns on
(off) inductor's mixed-order reductions (a norm's backward and its weight gradient in one
kernel; the default depends on the torch version), ``combo``
its combo kernels (independent small kernels launched as one), ``agg`` its aggressive
fusion (fusing kernels that share no memory access), and ``bf16`` keeps weights and
activations in bf16 without autocast, residual stream included: not how ``llmlab train`` runs,
but the most that a bf16 residual stream could save in the generated kernels; ``res16``
keeps autocast and fp32 weights but casts the residual stream to bf16 before the first block.

Each variant is compiled afresh and timed with CUDA events (median step over --steps after
warm-up). MFU counts the model's own FLOPs per token over the dense bf16 peak of the card.
``--profile`` adds each variant's kernel-time split (matmuls, attention, generated fused
kernels, the rest) and its 30 largest kernels.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from bench.common import train_config, write_result

GPT2 = ["model=gpt2", "optim=adamw", "model.d_model=768", "model.n_layers=12", "model.n_heads=12", "model.max_seq_len=1024"]


try:  # this torch's own choice, for the variants without ``mix``
    import torch._inductor.config as _inductor_config
    MIX_DEFAULT = bool(getattr(_inductor_config.triton, "mix_order_reduction", False))
except ImportError:
    MIX_DEFAULT = False


def config(overrides: list[str]) -> dict:
    return train_config(overrides)


def sdpa_context(backend: str | None):
    if backend is None:
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([getattr(SDPBackend, backend)])


def run_variant(name: str, args, vocab: int) -> dict:
    import torch._inductor.config as inductor_config

    from llmlab.model.transformer import ModelSpec, Transformer
    from llmlab.train.mfu import device_peak_flops
    from llmlab.train.optim import OPTIMIZER, build_optimizer

    sized = re.search(r"bs(\d+)", name)
    batch = int(sized.group(1)) if sized else args.batch_size
    backend = "CUDNN_ATTENTION" if "cudnn" in name else ("FLASH_ATTENTION" if "flash" in name else None)
    mode = "max-autotune-no-cudagraphs" if "autotune" in name else ("reduce-overhead" if "cg" in name else None)
    want_logits = "plainloss" in name
    inductor_config.coordinate_descent_tuning = "cdt" in name
    if hasattr(inductor_config.triton, "mix_order_reduction"):
        inductor_config.triton.mix_order_reduction = False if "nomix" in name else ("mix" in name or MIX_DEFAULT)
    inductor_config.combo_kernels = "combo" in name
    inductor_config.aggressive_fusion = "agg" in name
    pure_bf16 = "bf16" in name
    # the compile caches' keys leave out the SDPA backend pin, so a cached graph of another
    # variant would run its attention kernel instead (pytorch/pytorch#185449)
    inductor_config.force_disable_caches = True
    cfg = config(GPT2)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Transformer(ModelSpec.from_config(cfg, vocab)).cuda()
    if pure_bf16:
        model = model.to(torch.bfloat16)
    if "res16" in name:  # autocast as before, but the residual stream in bf16 from the first block on
        model.blocks[0].register_forward_pre_hook(lambda mod, args: (args[0].to(torch.bfloat16), *args[1:]))
    step_model = torch.compile(model, mode=mode)
    opt = build_optimizer(OPTIMIZER.config(cfg["optim"], "optim"), model, torch.device("cuda"))
    T = cfg["model"]["max_seq_len"]
    batches = [torch.randint(0, vocab, (batch, T + 1), device="cuda") for _ in range(4)]

    def step(i: int) -> torch.Tensor:
        b = batches[i % len(batches)]
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        with sdpa_context(backend), torch.autocast("cuda", dtype=torch.bfloat16, enabled=not pure_bf16):
            loss = step_model(b[:, :-1], b[:, 1:], logits=want_logits).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    t = time.perf_counter()
    for i in range(3):
        step(i)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t
    for i in range(3):
        step(i)
    torch.cuda.synchronize()
    times = []
    for i in range(args.steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step(i)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    dt = statistics.median(times)
    peak, source = device_peak_flops(torch.device("cuda"), "bf16")
    fpt = model.flops_per_token(T)
    row = {"variant": name, "batch": batch, "step_s": dt, "tokens_per_s": batch * T / dt,
           "mfu": fpt * batch * T / dt / peak, "flops_per_token": fpt, "peak_tflops": peak / 1e12,
           "compile_s": round(compile_s, 1), "mem_gb": torch.cuda.max_memory_allocated() / 2**30,
           "spread": [min(times), max(times)]}
    if args.profile:
        row["profile"] = profile(step)
    return row


def profile(step) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        for i in range(3):
            step(i)
        torch.cuda.synchronize()
    kernels = [(e.key, e.device_time_total / 3e3) for e in p.key_averages() if e.device_time_total > 0]
    kernels.sort(key=lambda kv: -kv[1])

    def kind(n: str) -> str:
        low = n.lower()
        if any(s in low for s in ("flash", "fmha", "cudnn", "attention")):
            return "attention"
        if any(s in low for s in ("gemm", "nvjet", "cutlass", "sm90_xmma", "cublas", "matmul")):
            return "matmul"
        if "triton" in low:
            return "fused (triton)"
        if "adam" in low:
            return "optimizer"
        return "other"
    split: dict[str, float] = {}
    for n, ms in kernels:
        split[kind(n)] = split.get(kind(n), 0.0) + ms
    return {"ms_per_step": {k: round(v, 2) for k, v in sorted(split.items(), key=lambda kv: -kv[1])},
            "top": [[n[:110], round(ms, 3)] for n, ms in kernels[:30]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="base,plainloss,bs64")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--name", default="gpu_probe", help="result file: bench/results/NAME.json")
    args = ap.parse_args()
    rows = []
    for name in args.variants.split(","):
        try:
            row = run_variant(name, args, args.vocab)
        except Exception as e:  # noqa: BLE001  (one variant failing leaves the others)
            row = {"variant": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "profile"}), flush=True)
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    result = {"gpu": torch.cuda.get_device_name(), "vocab": args.vocab, "mix_order_reduction_default": MIX_DEFAULT,
              "rows": rows}
    path = write_result(args.name, result)
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / path.name).write_text(path.read_text())
    for r in rows:
        if "error" in r:
            print(f"{r['variant']:>12}  {r['error']}")
        else:
            print(f"{r['variant']:>12}  bs {r['batch']:3}  {r['step_s'] * 1e3:7.1f} ms  {r['tokens_per_s']:10,.0f} tok/s  "
                  f"MFU {r['mfu']:.1%}  compile {r['compile_s']}s  mem {r['mem_gb']:.1f} GB")
    for r in rows:
        if "profile" in r:
            print(r["variant"], json.dumps(r["profile"]["ms_per_step"]))
            for n, ms in r["profile"]["top"]:
                print(f"{ms:8.3f} ms  {n}")


if __name__ == "__main__":
    main()
