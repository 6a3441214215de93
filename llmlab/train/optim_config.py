"""The optimizers' registry (config group ``optim``) and the default optimizer's Config, Muon's,
declared here without torch so that composing the default config imports none. The other
kinds nest their Configs in their classes in `llmlab.train.optim`, imported when a config
names one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from llmlab.errors import ConfigError
from llmlab.registry import Registry, bounded, choice

OPTIMIZER = Registry("optim", group="optim", impl="llmlab.train.optim")


def check_torch_has(name: str, since: str, prefix: str) -> None:
    """An optimizer kind that wraps ``torch.optim.<name>`` on a torch without it: one line."""
    import torch

    if not hasattr(torch.optim, name):
        raise ConfigError(f"{prefix}: optim={name.lower()} needs torch.optim.{name} (torch >= {since}); this torch is "
                          f"{torch.__version__}; use optim=adamw or upgrade torch")


@OPTIMIZER.option("muon")
@dataclass
class MuonConfig:
    several: ClassVar[bool] = True  # Muon for the matrices and AdamW for the rest: two optimizers in one
    kind: str = "muon"
    # with match_rms_adamw an update's RMS is AdamW's, so the lr is on AdamW's scale (Liu et al. 2025,
    # Moonlight); 0.02 suits the "original" rule. On the default run at 500 steps: 3e-3 and 5e-3 gave
    # validation losses within 0.01, 1e-2 0.04 worse (bench/README.md, the default recipe)
    lr: float = bounded(4e-3, above=0)
    momentum: float = bounded(0.95, at_least=0, below=1)  # at 1 the buffer never takes a gradient; above, it diverges
    nesterov: bool = True
    weight_decay: float = bounded(0.0, at_least=0)
    adjust_lr: str | None = choice("match_rms_adamw", (None, "original", "match_rms_adamw"))  # scale updates so one lr suits every shape
    # the Newton-Schulz iterations' precision; auto: bf16 on CUDA (torch's Muon), fp32 elsewhere
    ns_precision: str = choice("auto", ("auto", "bf16", "fp32"))
    # the embeddings', head's and norms' lr: on the default run at 500 steps (qknorm attention),
    # 3e-3, 6e-3, 1.2e-2 and 2.4e-2 gave validation losses 3.758, 3.630, 3.573 and 3.506
    adamw_lr: float = bounded(2.4e-2, above=0)
    adamw_beta1: float = bounded(0.9, at_least=0, below=1)
    adamw_beta2: float = bounded(0.95, at_least=0, below=1)
    adamw_weight_decay: float = bounded(0.1, at_least=0)

