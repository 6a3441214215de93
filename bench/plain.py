"""A minimal plain-PyTorch GPT and training loop: the reference that llmlab's own loop is timed
against. Same network as the ``gpt2`` preset (learned positions, pre-LayerNorm with biases,
GELU MLP, tied embeddings, SDPA causal attention; the linear layers' biases optional, as
``model.bias``), AdamW (the fused kernel on the CPU and CUDA), warmup + cosine, random windows of
the same token array; on the CPU, glibc's malloc keeps freed memory, as in ``llmlab train``. No config system, no logging, no checkpoints: what is left is the cost
of the model itself."""

from __future__ import annotations

import math
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from llmlab.model.attention import fused_sdpa
from llmlab.train.device import keep_freed_memory


class Block(nn.Module):
    def __init__(self, d: int, heads: int, bias: bool = True):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=bias), nn.Linear(d, d, bias=bias)
        self.up, self.down = nn.Linear(d, 4 * d, bias=bias), nn.Linear(4 * d, d, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = fused_sdpa(q, k, v, is_causal=True)  # SDPA; on a CPU in bf16, its far faster fp32 kernel, as llmlab
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class PlainGPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, block: int, bias: bool = True):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(block, d)
        self.blocks = nn.ModuleList(Block(d, heads, bias) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "down.weight"))
                                else 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def train_plain(tokens: np.ndarray, vocab: int, d: int, layers: int, heads: int, block: int, batch: int,
                steps: int, lr: float, warmup: int, min_lr: float, device: str = "cpu", precision: str = "fp32",
                compile: bool = False, log_every: int = 10, seed: int = 0, weight_decay: float = 0.1,
                betas: tuple[float, float] = (0.9, 0.95), bias: bool = True) -> dict:
    """Train ``steps`` steps; tokens/s is the median over windows of ``log_every`` steps after
    the first (warm-up, compilation), as llmlab reports it."""
    torch.manual_seed(seed)
    dev = torch.device(device)
    if dev.type == "cpu":
        keep_freed_memory()  # as llmlab train does: part of the fastest plain loop on a CPU, not of llmlab
    model = PlainGPT(vocab, d, layers, heads, block, bias).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    fused = dev.type in ("cuda", "cpu")  # one kernel a tensor; on the CPU 5% of this model's step
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=lr, betas=betas, fused=fused, foreach=None if fused else True)
    step_model = torch.compile(model) if compile else model
    amp = (torch.autocast(dev.type, dtype=torch.bfloat16) if precision == "bf16"
           else torch.autocast(dev.type, enabled=False))
    rng = np.random.default_rng(seed)

    def lr_at(step: int) -> float:
        if step < warmup:
            return lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))

    rates, losses = [], []
    t = time.perf_counter()
    for step in range(steps):
        starts = rng.integers(0, len(tokens) - block, size=batch)
        data = torch.from_numpy(np.stack([tokens[s:s + block + 1] for s in starts]).astype(np.int64))
        x, y = data[:, :-1].to(dev, non_blocking=True), data[:, 1:].to(dev, non_blocking=True)
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        with amp:
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % log_every == 0:
            losses.append(loss.item())  # synchronizes, as a logged loss does
            now = time.perf_counter()
            if step + 1 > log_every:
                rates.append(log_every * batch * block / (now - t))
            t = now
    return {"tokens_per_s": statistics.median(rates) if rates else None, "final_loss": losses[-1] if losses else None,
            "params": sum(p.numel() for p in model.parameters()), "model": model}


@torch.no_grad()
def eval_plain(model: PlainGPT, tokens: np.ndarray, block: int, batch: int, device: str = "cpu",
               max_windows: int | None = None) -> float:
    """Mean loss over non-overlapping windows of ``tokens`` (all of them, or the first few)."""
    model.eval()
    n = (len(tokens) - 1) // block
    if max_windows:
        n = min(n, max_windows)
    total, count = 0.0, 0
    for first in range(0, n, batch):
        starts = range(first * block, min(n, first + batch) * block, block)
        data = torch.from_numpy(np.stack([tokens[s:s + block + 1] for s in starts]).astype(np.int64)).to(device)
        loss = model(data[:, :-1], data[:, 1:])
        total += float(loss) * data.shape[0]
        count += data.shape[0]
    model.train()
    return total / count
