"""``probe=residual``: how large the residual stream is after each block."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from llmlab.registry import bounded
from llmlab.train.groups.probe import PROBE, Probe


@PROBE.register("residual")
class ResidualSize(Probe):
    """The residual stream's size after each block, as a root mean square. Logged as
    ``probe/rms_<i>`` (block i from 0), on the same first windows of the validation split at
    every log step, so that only the weights move it. Pre-norm adds every block's output to the
    stream, which grows with depth; post-norm normalises it after each block (Xiong et al. 2020)."""

    @dataclass
    class Config:
        kind: str = "residual"
        windows: int = bounded(2, at_least=1)  # validation windows read (the first ones, the same each time)

    def measure(self, step: int) -> Mapping[str, float]:
        import torch

        model, seq = self.model, self.data.seq_len
        rows = max(1, min(self.cfg.windows, len(self.data.val_tokens) // seq))
        tokens = torch.as_tensor(self.data.val_tokens[:rows * seq].astype("int64")).view(rows, seq)
        squares: list[torch.Tensor] = []

        def keep(block, args, output):
            stream = output[0] if isinstance(output, tuple) else output
            squares.append(stream.detach().float().pow(2).mean())

        hooks = [block.register_forward_hook(keep) for block in model.blocks]
        was_training = model.training
        try:
            model.eval()
            with torch.no_grad():
                model(tokens.to(next(model.parameters()).device), logits=False)
        finally:
            model.train(was_training)
            for hook in hooks:
                hook.remove()
        return {f"rms_{i}": float(square.sqrt()) for i, square in enumerate(squares)}
