"""``optim=radam``: rectified Adam, in one file."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from llmlab.registry import bounded
from llmlab.train.optim import AdamW, OptimizerKind, param_groups
from llmlab.train.optim_config import OPTIMIZER


@OPTIMIZER.register("radam")
class RAdam(OptimizerKind, torch.optim.RAdam):
    """RAdam (Liu et al. 2020, On the Variance of the Adaptive Learning Rate and Beyond): Adam
    that takes plain momentum steps while its second-moment estimate is too young to trust
    (section 4), with decoupled weight decay; norms, biases and embeddings are not decayed."""

    @dataclass
    class Config(AdamW.Config):  # AdamW's settings, with Adam's usual beta2
        kind: str = "radam"
        beta2: float = bounded(0.999, at_least=0, below=1)

    def __init__(self, cfg, model: nn.Module, device: torch.device):
        groups = param_groups(model, cfg.weight_decay, cfg.decay_embeddings)
        super().__init__(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, decoupled_weight_decay=True,
                         foreach=True)
