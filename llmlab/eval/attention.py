"""Attention analysis: how many keys each head attends to, and how different the heads are.

Per layer and head, on fixed windows of the train and val splits:
- entropy H of each query's attention row, in bits;
- support 2^H, the effective number of keys attended to;
- normalised support, support over the number of keys the query may see (1 = uniform);
- attended share: the keys with a non-zero weight over those the query may see (below 1 only
  where attention is sparse: dsa's top-k);
- diversity: the mean earth-mover distance between the heads of a layer, on each query's
  attention CDFs (sum over key positions of |CDF_a - CDF_b|), over all head pairs.

The weights are the model's own: the forward pass with ``need_weights`` computes the same
softmax as the fused kernel (same rotated queries and keys, same causal or window mask; MLA's
keys rebuilt from its latent), which tests/model check against the SDPA output.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import torch

from llmlab.data.batches import fixed_window_batches, num_fixed_windows

HIST_BINS = np.linspace(0.0, 1.0, 41)


def row_stats(weights: torch.Tensor, visible: torch.Tensor) -> dict[str, torch.Tensor]:
    """weights: (B, H, T, Tk) attention rows; visible: (T,) keys each query may see.
    Returns (B, H, T) entropy in bits, support, normalised support and attended share."""
    w = weights.double()
    plogp = torch.where(w > 0, w * torch.log2(w.clamp_min(1e-300)), torch.zeros_like(w))
    entropy = -plogp.sum(-1)
    support = torch.exp2(entropy)
    return {"entropy_bits": entropy, "support": support, "normalized_support": support / visible.double(),
            "attended_share": (w > 0).sum(-1) / visible.double()}


def head_diversity(weights: torch.Tensor) -> torch.Tensor:
    """Mean pairwise earth-mover distance between heads, per query: (B, H, T, Tk) -> (B, T).
    Keys are one position apart, so the 1-D EMD is the L1 distance between the CDFs."""
    H = weights.shape[1]
    if H < 2:
        return torch.zeros(weights.shape[0], weights.shape[2], dtype=torch.float64, device=weights.device)
    cdf = weights.double().cumsum(-1)
    pairs = [(cdf[:, a] - cdf[:, b]).abs().sum(-1) for a, b in itertools.combinations(range(H), 2)]
    return torch.stack(pairs).mean(0)


@torch.no_grad()
def collect(model, tokens: np.ndarray, block: int, windows: int, batch: int, device: torch.device) -> dict:
    """Per-layer statistics over ``windows`` evenly spaced windows of ``tokens``."""
    model.eval()
    L = len(model.blocks)
    positions = torch.arange(block, device=device)
    visible = []
    for blk in model.blocks:
        mask = blk.attn.key_mask(positions, positions)
        visible.append(torch.full((block,), block, device=device) if mask is None else mask.sum(-1))
    per_layer: list[dict[str, list[torch.Tensor]]] = [{"entropy_bits": [], "support": [], "normalized_support": [],
                                                      "attended_share": [], "emd": [], "emd_normalized": []}
                                                     for _ in range(L)]
    for window in fixed_window_batches(tokens, block, batch, windows):
        x = window[:, :-1].to(device)
        out = model(x, need_weights=True)
        for i, w in enumerate(out.weights):
            stats = row_stats(w, visible[i])
            for key, value in stats.items():
                per_layer[i][key].append(value.cpu())  # (B, H, T)
            emd = head_diversity(w)
            per_layer[i]["emd"].append(emd.cpu())  # (B, T)
            per_layer[i]["emd_normalized"].append((emd / visible[i].double()).cpu())
    merged = [{k: torch.cat(v) for k, v in layer.items()} for layer in per_layer]
    return {"layers": merged, "visible": [v.cpu() for v in visible],
            "windows": num_fixed_windows(tokens, block, windows)}


def summarize(raw: dict) -> dict:
    """The JSON numbers of one split."""
    layers = []
    for layer in raw["layers"]:
        H = layer["support"].shape[1]
        heads = [{k: float(layer[k][:, h].mean()) for k in ("entropy_bits", "support", "normalized_support",
                                                              "attended_share")}
                 for h in range(H)]
        layers.append({"heads": heads, "diversity_emd": float(layer["emd"].mean()),
                       "diversity_emd_normalized": float(layer["emd_normalized"].mean())})
    all_norm = torch.cat([layer["normalized_support"].flatten() for layer in raw["layers"]])
    all_support = torch.stack([layer["support"] for layer in raw["layers"]])  # (L, B, H, T)
    all_ns = torch.stack([layer["normalized_support"] for layer in raw["layers"]])
    all_ent = torch.cat([layer["entropy_bits"].flatten() for layer in raw["layers"]])
    length = raw["visible"][0]  # keys the query at each position sees (first layer; SWA caps it)
    counts, _ = np.histogram(all_norm.numpy(), bins=HIST_BINS)
    return {
        "windows": raw["windows"],
        "mean": {"entropy_bits": float(all_ent.mean()), "support": float(all_support.mean()),
                 "normalized_support": float(all_norm.mean()),
                 "attended_share": float(torch.cat([la["attended_share"].flatten() for la in raw["layers"]]).mean()),
                 "diversity_emd": float(np.mean([la["diversity_emd"] for la in layers]))},
        "layers": layers,
        "by_length": {"length": (torch.arange(all_support.shape[-1]) + 1).tolist(),
                      "visible_keys": length.tolist(),
                      "support": all_support.mean(dim=(0, 1, 2)).tolist(),
                      "normalized_support": all_ns.mean(dim=(0, 1, 2)).tolist()},
        "histogram": {"bins": HIST_BINS.tolist(), "normalized_support": counts.tolist()},
    }


def draw(raw: dict[str, dict], summaries: dict[str, dict], out_dir: Path, title: str) -> list[Path]:
    """The three summary figures: histogram train vs val, support against length, and the
    layer x head grid of histograms."""
    from llmlab.eval.plots import curves_plot, grid_histograms_plot, histograms_plot

    paths = [histograms_plot({s: torch.cat([la["normalized_support"].flatten() for la in r["layers"]]).numpy()
                              for s, r in raw.items()}, out_dir / "attention_support_hist.png",
                             "normalised support (support / visible keys)", f"{title}: all layers and heads",
                             HIST_BINS)]
    curves = {}
    for split, summary in summaries.items():
        bl = summary["by_length"]
        curves[f"{split} support"] = {"x": bl["length"], "mean": bl["support"]}
        curves[f"{split} visible keys"] = {"x": bl["length"], "mean": bl["visible_keys"]}
    paths.append(curves_plot(curves, out_dir / "attention_support_by_length.png", "sequence length (tokens of context)",
                             "support (keys attended to)", f"{title}: mean support against sequence length"))
    splits = list(raw)
    grid = [[{s: raw[s]["layers"][i]["normalized_support"][:, h].flatten().numpy() for s in splits}
             for h in range(raw[splits[0]]["layers"][i]["support"].shape[1])]
            for i in range(len(raw[splits[0]]["layers"]))]
    paths.append(grid_histograms_plot(grid, out_dir / "attention_support_grid.png", "normalised support",
                                      f"{title}: layer x head"))
    return paths


@torch.no_grad()
def example_heatmaps(model, ids: list[int], labels: list[str], out_dir: Path, title: str,
                     device: torch.device) -> list[Path]:
    """One figure per layer: each head's attention over the example's tokens."""
    from llmlab.eval.plots import heatmaps_plot

    model.eval()
    out = model(torch.tensor([ids], device=device), need_weights=True)
    return [heatmaps_plot(w[0].float().cpu().numpy(), labels, out_dir / f"attention_heatmap_layer{i}.png",
                          f"{title}: layer {i}") for i, w in enumerate(out.weights)]


def token_labels(tokenizer, ids: list[int], width: int = 8) -> list[str]:
    """Short printable labels for heat-map axes."""
    return [repr(tokenizer.decode([i]))[1:-1].replace(" ", "␣")[:width] or "∅" for i in ids]
