"""``train.ema=<decay>``: an exponential moving average of the weights, kept beside them.

After every optimizer step each averaged weight moves toward the trained one,
``ema <- decay * ema + (1 - decay) * w`` (starting from the weights at the start of the run).
The average is a part with its own state: it is saved in each checkpoint as
``ema.safetensors`` (the same names as ``model.safetensors``; buffers are the model's own), and
a resume restores it, so a resumed run averages exactly as an uninterrupted one. The periodic
evaluation scores it beside the raw weights (``val/loss_ema``), which judges a run before its
cooldown; ``eval``, ``sample`` and ``export`` take ``weights=ema``.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Mapping

import torch
from torch import nn

EMA_FILE = "ema.safetensors"


class WeightAverage:
    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        # each tensor once (a tied head shares the embedding), by its first name
        seen, self.params = set(), {}
        for name, p in model.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                self.params[name] = p
        self.shadow = {name: p.detach().clone() for name, p in self.params.items()}

    @torch.no_grad()
    def update(self) -> None:
        """One step of the average, after the optimizer's."""
        for n, p in self.params.items():
            self.shadow[n].lerp_(p.detach(), 1 - self.decay)

    def state_dict(self, weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What ema.safetensors holds: ``weights`` (the checkpoint's own, each tied tensor
        once) with every averaged parameter in place of the trained one."""
        return {k: (self.shadow[k] if k in self.shadow else v).detach().cpu().contiguous() for k, v in weights.items()}

    def load_state_dict(self, weights: Mapping[str, torch.Tensor]) -> None:
        """The average from a checkpoint's ema.safetensors; a name or shape that is not the
        model's raises a ValueError."""
        missing = [n for n in self.shadow if n not in weights]
        wrong = [n for n in self.shadow if n in weights and tuple(weights[n].shape) != tuple(self.shadow[n].shape)]
        if missing or wrong:
            raise ValueError(f"missing {missing[:3]}" if missing else f"shape mismatch {wrong[:3]}")
        with torch.no_grad():
            for n, t in self.shadow.items():
                t.copy_(weights[n])

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The model computes with the average inside the block, with its own weights after."""
        def swap():
            for n, p in self.params.items():
                p.data, self.shadow[n] = self.shadow[n], p.data
        swap()
        try:
            yield
        finally:
            swap()
