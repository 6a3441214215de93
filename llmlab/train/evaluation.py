"""Evaluation during training: validation loss, perplexity, accuracy and bits per byte on a
fixed set of windows, a teacher comparison when distilling, and short prompt completions."""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from llmlab.eval.loss import bits_per_byte, evaluate_loss
from llmlab.eval.tasks import score_task
from llmlab.model.transformer import Transformer
from llmlab.sample.generate import SamplingConfig, generate
from llmlab.train.settings import LoopConfig


@dataclass
class Evaluator:
    """The periodic evaluation of a run: its validation tokens and how to score them, built
    once with the run; ``evaluator(model)`` returns the metrics and prompt completions. Every
    rank scores the same windows, so all agree without a reduction; under FSDP they must all
    take part anyway."""

    val_tokens: np.ndarray
    seq_len: int
    loop: LoopConfig
    amp: Any  # the autocast context the run trains in
    distiller: Any  # a `Distiller` (also compares with its teacher), or None
    tokenizer: Any
    bytes_per_token: float  # of the validation split, for bits per byte
    seed: int
    device: torch.device
    tasks: dict = field(default_factory=dict)  # train.eval_tasks: each file's questions, by its name

    def loss(self, model: Transformer) -> float:
        """The validation loss alone, on the same windows."""
        loop = self.loop
        return evaluate_loss(model, self.val_tokens, self.seq_len, loop.batch_size, self.device, self.amp,
                             loop.eval_windows or None)["loss"]

    def __call__(self, model: Transformer) -> tuple[dict[str, float], list[tuple[str, str]]]:
        loop, windows = self.loop, self.loop.eval_windows or None
        res = evaluate_loss(model, self.val_tokens, self.seq_len, loop.batch_size, self.device, self.amp, windows)
        out = {"val/loss": res["loss"], "val/ppl": res["ppl"], "val/accuracy": res["accuracy"]}
        if self.distiller is not None:
            out.update(self.distiller.compare(model, self.val_tokens, self.seq_len, loop.batch_size, self.device,
                                              self.amp, windows))
        samples = []
        if model.objective.causal:  # bits per byte of a masked-token loss would mean nothing
            out["val/bpb"] = bits_per_byte(res["loss"], 1, self.bytes_per_token)
            for name, questions in self.tasks.items():
                scored = score_task(model, self.tokenizer, questions, self.device, self.amp)
                out[f"val/task/{name}/acc"], out[f"val/task/{name}/acc_norm"] = scored["acc"], scored["acc_norm"]
            if math.isfinite(res["loss"]):  # a diverged model has nothing to say
                samples = complete_prompts(model, self.tokenizer, loop.prompts, loop.sample_tokens, self.device,
                                           self.seed)
        return out, samples


def val_line(step: int, val: dict[str, float]) -> str:
    bpb = f"  bpb {val['val/bpb']:.4f}" if "val/bpb" in val else ""
    agree = (f"  teacher agreement {val['val/teacher_agreement']:.3f} KL {val['val/teacher_kl']:.3f}"
             if "val/teacher_agreement" in val else "")
    ema = f" (average {val['val/loss_ema']:.4f})" if "val/loss_ema" in val else ""
    return f"step {step:>6}  val loss {val['val/loss']:.4f}{ema}  ppl {val['val/ppl']:.2f}  acc {val['val/accuracy']:.3f}{bpb}{agree}"


def complete_prompts(model: Transformer, tokenizer, prompts: list[str], n_tokens: int, device: torch.device,
                     seed: int) -> list[tuple[str, str]]:
    """Sample a short completion of each prompt, with a generator of its own so the training
    random stream is untouched."""
    if not prompts or not n_tokens:
        return []
    gen = torch.Generator(device=device).manual_seed(seed)
    cfg = SamplingConfig(max_new_tokens=n_tokens, temperature=0.8, top_k=50)
    out = []
    for prompt in prompts:
        ids = tokenizer.encode(prompt) or [tokenizer.eos_id or 0]
        x = torch.tensor([ids], device=device)
        y = generate(model, x, cfg, eos_id=tokenizer.eos_id, generator=gen)
        out.append((prompt, tokenizer.decode(y[0, len(ids):].tolist(), skip_special=True)))
    return out
