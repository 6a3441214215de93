"""``probe=weights``: how large each block's weights are."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from llmlab.train.groups.probe import PROBE, Probe


@PROBE.register("weights")
class WeightSize(Probe):
    """The size of each block's weights, as a root mean square. Logged as
    ``probe/weight_rms_<i>`` (block i from 0, every parameter of the block together): what
    weight decay and the learning rate do to them over a run."""

    @dataclass
    class Config:
        kind: str = "weights"

    def measure(self, step: int) -> Mapping[str, float]:
        import torch

        out = {}
        with torch.no_grad():
            for i, block in enumerate(self.model.blocks):
                # under FSDP a parameter is a DTensor of shards: its whole tensor, every rank taking part
                params = [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().float()
                          for p in block.parameters()]
                total = sum(float(p.pow(2).sum()) for p in params)
                out[f"weight_rms_{i}"] = (total / max(1, sum(p.numel() for p in params))) ** 0.5
        return out
