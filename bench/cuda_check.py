"""The decode and training paths on a CUDA GPU, checked against themselves: the CPU suite
covers them on the CPU, and a GPU has other kernels (SDPA backends, cuBLAS) and other ways to
go wrong (a tensor left on the host, an inference tensor kept for training).

    python -m bench.cuda_check        # writes bench/results/cuda_check.json; exits 1 on a mismatch
    python -m bench.cuda_check --device cpu    # the same checks on the CPU (a dry run of this script)

For each attention kind (RoPE positions): greedy decoding with the KV cache gives the tokens of
decoding without it; the cached, one-token-at-a-time logits match a full forward; a model that
decoded first (inference mode, RoPE's table grown there) trains to the gradients of one that
never decoded; decoding with its step replayed as a CUDA graph gives the tokens of launching
each kernel (where a kind's step can be recorded; the others say why not); and (for mla and
dsa) a ``torch.compile``d training step gives the eager loss. The kinds are mha, gqa, mla, swa
(a rolling cache) and dsa (the indexer's top-k over an mla base). Last, ``optim=muon`` trains a
fixed batch on the GPU: its loss must fall to under half, with every weight finite.
"""

from __future__ import annotations

import argparse
import sys

import torch

from bench.common import write_result

KINDS = {"mha": {"kind": "mha"}, "gqa": {"kind": "gqa", "kv_heads": 2},
         "mla": {"kind": "mla", "kv_rank": 32, "rope_dim": 8, "nope_dim": 8, "v_dim": 16},
         "swa": {"kind": "swa", "window": 5, "kv_heads": 2},
         "dsa": {"kind": "dsa", "topk": 4, "index_heads": 2, "index_dim": 8, "q_rank": 12, "kv_rank": 16,
                 "rope_dim": 4, "nope_dim": 8, "v_dim": 8}}
COMPILED = ("mla", "dsa")  # one compile each (the slowest part): RoPE inside attention, and the indexer's top-k


def model(attention: dict, device: str, seed: int = 0):
    from llmlab.model.config import ModelSpec
    from llmlab.model.transformer import Transformer

    torch.manual_seed(seed)
    cfg = {"model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "max_seq_len": 64},
           "attention": attention, "pos": {"kind": "rope"}}
    return Transformer(ModelSpec.from_config(cfg, 97)).to(device)


def check(name: str, attention: dict, device: str) -> dict:
    from llmlab.sample.generate import SamplingConfig, generate

    out: dict = {}
    m = model(attention, device)
    prompt = torch.randint(0, 97, (2, 5), device=device, generator=torch.Generator(device).manual_seed(1))
    greedy = SamplingConfig(max_new_tokens=40, temperature=0.0)
    cached = generate(m, prompt, greedy)
    plain = generate(m, prompt, greedy, use_cache=False)
    out["cache_equals_no_cache"] = bool(torch.equal(cached, plain))
    m.eval()
    with torch.no_grad():
        full = m(cached).logits
        cache = m.new_cache(cached.shape[0], 64)
        steps = [m(cached[:, :5], cache=cache).logits]
        steps += [m(cached[:, t:t + 1], cache=cache).logits for t in range(5, cached.shape[1])]
    diff = (torch.cat(steps, dim=1) - full).abs().max().item()
    out["incremental_logits_max_diff"] = diff
    out["incremental_ok"] = diff < 1e-4
    # CUDA graph decoding (llmlab.sample.graphs): the tokens of launching each kernel, past a refill
    from llmlab.sample.graphs import why_not
    longer = SamplingConfig(max_new_tokens=70, temperature=0.0)
    out["graph_decoding"] = why_not(m, m.new_cache(1, 1)) or "recorded"
    if device.startswith("cuda") and out["graph_decoding"] == "recorded":
        launched, replayed = generate(m, prompt, longer), generate(m, prompt, longer, graphs=True)
        out["graph_ok"] = bool(torch.equal(launched, replayed))
    decoded, fresh = model(attention, device), model(attention, device)
    decoded.train(), fresh.train()
    ids = generate(decoded, prompt, SamplingConfig(max_new_tokens=70, temperature=0.0))  # past max_seq_len
    window = ids[:, -64:]
    for mm in (decoded, fresh):
        mm(window, window).loss.backward()
    # CUDA's attention backward may add in any order: equal up to rounding, not bit for bit
    gdiff = max((a.grad - b.grad).abs().max().item() for a, b in zip(decoded.parameters(), fresh.parameters()))
    out["train_after_decode_grad_max_diff"] = gdiff
    out["train_after_decode_ok"] = gdiff < 1e-5
    if name not in COMPILED:
        print(name, out, flush=True)
        return out
    eager = model(attention, device)
    compiled = torch.compile(model(attention, device))
    le, lc = eager(window, window).loss, compiled(window, window).loss
    out["compiled_loss"], out["eager_loss"] = lc.item(), le.item()
    out["compiled_ok"] = abs(lc.item() - le.item()) < 1e-4
    print(name, out, flush=True)
    return out


def muon_check(device: str) -> dict:
    """``optim=muon`` (Newton-Schulz in bf16 on CUDA, torch's own Muon) lowers the loss of a
    fixed batch as AdamW does, and every weight stays finite."""
    from llmlab.train.optim import OPTIMIZER, build_optimizer

    out: dict = {}
    if not hasattr(torch.optim, "Muon"):
        return {"muon": f"torch {torch.__version__} has no torch.optim.Muon"}
    batch = torch.randint(0, 97, (4, 65), device=device, generator=torch.Generator(device).manual_seed(2))
    for kind in ("adamw", "muon"):
        m = model({"kind": "mha"}, device)
        opt = build_optimizer(OPTIMIZER.config({"kind": kind}, "optim"), m, torch.device(device))
        losses = []
        for _ in range(30):
            loss = m(batch[:, :-1], batch[:, 1:]).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        out[kind] = {"first": losses[0], "last": losses[-1],
                     "finite": all(bool(p.isfinite().all()) for p in m.parameters())}
    out["muon_ok"] = out["muon"]["finite"] and out["muon"]["last"] < 0.5 * out["muon"]["first"]
    print("optim=muon", out, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    device = ap.parse_args().device
    if device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("bench.cuda_check: no CUDA GPU here")
    results = {name: check(name, attention, device) for name, attention in KINDS.items()}
    results["optim=muon"] = muon_check(device)
    ok = all(v for r in results.values() for k, v in r.items() if k.endswith("_ok") or k == "cache_equals_no_cache")
    write_result("cuda_check" if device.startswith("cuda") else f"cuda_check_{device}", {
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else device, "torch": torch.__version__, "ok": ok,
                                "kinds": results})
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
