"""Optimizers (config group ``optim``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from llmlab.errors import ConfigError
from llmlab.registry import Registry

OPTIMIZER = Registry("optim")


def param_groups(model: nn.Module, weight_decay: float, decay_embeddings: bool = False) -> list[dict]:
    """Decay only matrices of linear layers: norms, biases and (by default) embeddings are
    left alone, as in GPT-2/GPT-3 practice. Tied weights appear once."""
    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay, seen = [], [], set()
    for _, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        is_embedding = id(p) in embedding_ids
        if p.dim() >= 2 and (decay_embeddings or not is_embedding):
            decay.append(p)
        else:
            no_decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


@OPTIMIZER.register("adamw")
class AdamW:
    """Loshchilov & Hutter 2019: Adam with decoupled weight decay."""

    @dataclass
    class Config:
        kind: str = "adamw"
        lr: float = 3e-3
        beta1: float = 0.9
        beta2: float = 0.95
        eps: float = 1e-8
        weight_decay: float = 0.1
        decay_embeddings: bool = False

        def check(self, prefix: str) -> None:
            if not self.lr > 0:
                raise ConfigError(f"{prefix}.lr: must be > 0, got {self.lr}")
            for key in ("beta1", "beta2"):
                if not 0 <= getattr(self, key) < 1:
                    raise ConfigError(f"{prefix}.{key}: must be in [0, 1), got {getattr(self, key)}")
            if self.weight_decay < 0:
                raise ConfigError(f"{prefix}.weight_decay: must be >= 0, got {self.weight_decay}")

    @staticmethod
    def create(cfg, model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
        groups = param_groups(model, cfg.weight_decay, cfg.decay_embeddings)
        # the fused kernel is one launch per step on CUDA; foreach elsewhere
        fused = device.type == "cuda"
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                                 fused=fused, foreach=None if fused else True)


def build_optimizer(cfg, model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
    return OPTIMIZER.get(cfg.kind).create(cfg, model, device)
