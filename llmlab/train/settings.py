"""The typed ``train`` config: every section checked before any work starts. No torch at
import (``--cfg job`` and a mistake's one-line error need none); the checks that build parts
import it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from llmlab.data.corpus import CORPUS
from llmlab.data.tokenizer import TOKENIZER
from llmlab.errors import ConfigError
from llmlab.model.config import ModelSpec
from llmlab.names import parse_flops
from llmlab.registry import bounded, choice, parse_dataclass, section, store_schema
from llmlab.train.device import PRECISIONS
from llmlab.train.loggers import LOGGER
from llmlab.train.optim_config import OPTIMIZER
from llmlab.train.schedule import SCHEDULE

HEAD_LOSS = ("auto", "fused", "plain")  # train.head_loss


@dataclass
class LoopConfig:
    """The ``train`` section."""

    steps: int = bounded(1000, at_least=1)  # the default run: 2M tokens, about 8 minutes on 2 CPU cores
    batch_size: int = bounded(8, at_least=1)
    grad_accum: int = bounded(1, at_least=1)
    batch_tokens: int | None = None  # tokens per optimizer step; when set, grad_accum = batch_tokens / (batch_size * max_seq_len)
    grad_clip: float = bounded(1.0, at_least=0)  # max global gradient norm; 0 turns clipping off
    log_every: int = bounded(10, at_least=1)
    eval_every: int = bounded(200, at_least=0)  # 0: only at the end
    eval_windows: int = bounded(64, at_least=0)  # validation windows per periodic eval (`llmlab eval` scores the whole split)
    ckpt_every: int = bounded(200, at_least=0)  # 0: only at the end
    keep_checkpoints: int = bounded(2, at_least=0)
    compile: bool = False  # torch.compile the model
    prompts: list[str] = field(default_factory=lambda: ["def ", "class ", "import "])
    sample_tokens: int = bounded(48, at_least=0)  # tokens completed per prompt at each eval
    resume: str | None = "auto"  # auto: continue from this run dir's latest checkpoint; a checkpoint path; null: fresh
    resume_weights_only: bool = False  # a checkpoint without trainer.pt: continue from its weights, fresh optimizer
    max_tokens: int | None = bounded(None, above=0)  # the run's length in tokens (replaces steps; the schedule spans it)
    max_flops: Any = None  # the run's length in training FLOPs (6e15 or 1e15*6), by the model card's FLOPs/token; replaces steps
    max_steps: int | None = bounded(None, above=0)  # stop at this step and save a checkpoint; the schedule still spans steps (resume later)
    max_time: float | None = bounded(None, at_least=0)  # seconds; stop and save a checkpoint once training has run this long
    fsdp: bool = False  # under torchrun: FSDP2 (shard params, grads, optimizer state) instead of DDP
    head_loss: str = choice("auto", HEAD_LOSS)  # fused: LM head + cross-entropy in chunks, no logits kept; auto: fused where a micro-batch has >= 4M logits, not in fp16

    def check(self, prefix: str) -> None:
        if self.max_flops is not None:
            self.max_flops = parse_flops(self.max_flops, f"{prefix}.max_flops")
            if self.max_tokens is not None:
                raise ConfigError(f"{prefix}.max_flops: set either max_flops or max_tokens (both set the run's length), "
                                  f"not both: max_flops={self.max_flops:.3g}, max_tokens={self.max_tokens}")

    def planned_steps(self, tokens_per_step: int, flops_per_token: int) -> int:
        """Optimizer steps of the run: enough to cover ``max_tokens`` or ``max_flops`` (the
        last step may pass it by less than a step), else ``steps``."""
        if self.max_tokens:
            return math.ceil(self.max_tokens / tokens_per_step)
        if self.max_flops is not None:
            per_step = flops_per_token * tokens_per_step
            if self.max_flops < per_step:
                raise ConfigError(f"train.max_flops: {self.max_flops:.3g} is less than one step, which takes "
                                  f"{per_step:.3g} FLOPs ({flops_per_token:,} FLOPs/token x {tokens_per_step:,} "
                                  "tokens/step)")
            return math.ceil(self.max_flops / per_step)
        return self.steps


DATA = ("corpus", "teacher")


@dataclass
class DistillConfig:
    """The ``distill`` section of ``llmlab train``."""

    teacher: str | None = None  # a checkpoint or run dir; null: no distillation
    weight: float = bounded(1.0, at_least=0, at_most=1)  # share of the KL term in the loss; 0 = the plain data loss
    temperature: float = bounded(1.0, above=0)  # softens both distributions in the KL term
    data: str = choice("corpus", DATA)  # corpus: the training windows; teacher: the teacher's continuations of their start
    prompt_tokens: int = bounded(8, at_least=1)  # data=teacher: tokens of each training window kept as the prompt
    gen_temperature: float = bounded(0.0, at_least=0)  # data=teacher: 0 = the teacher's greedy text, else sampled
    gen_batch: int = bounded(64, at_least=1)  # data=teacher: windows the teacher writes at once (batched decoding is cheaper)


@dataclass
class TrainConfig:
    """``llmlab train``'s whole config: the run's own settings, and one section per part,
    filled by the config groups (``model/attention=gqa`` puts GQA's settings under ``attention``)."""

    seed: int = 1337
    device: str = "auto"  # auto (cuda > mps > cpu) | cpu | cuda | cuda:N | mps
    precision: str = choice("auto", PRECISIONS)  # auto: bf16 on CUDA GPUs that have it, else fp32; fp16 is loss-scaled
    cache_dir: str | None = None  # prepared data; null: $LLMLAB_CACHE or .cache/llmlab
    train: LoopConfig = field(default_factory=LoopConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    data: Any = section()
    tokenizer: Any = section()
    model: Any = section()
    attention: Any = section()
    ffn: Any = section()
    norm: Any = section()
    pos: Any = section()
    objective: Any = section()
    optim: Any = section()
    sched: Any = section()
    logger: Any = section()

    def check(self, prefix: str) -> None:
        from llmlab.train.device import resolve_device

        resolve_device(self.device)  # an unknown or absent device is a config mistake


store_schema("train", TrainConfig)
TOP_LEVEL = {f.name for f in fields(TrainConfig)}


@dataclass
class TrainJob:
    seed: int
    device: str
    precision: str
    cache_dir: str | None
    data: Any
    tokenizer: Any
    spec: ModelSpec
    optim: Any
    sched: Any
    logger: Any
    loop: LoopConfig
    distill: DistillConfig


def check_train_config(cfg: Mapping[str, Any]) -> TrainJob:
    """Check every section of a composed ``train`` config; the first problem is a ConfigError
    that names its key. Also builds a block's parts on the meta device, so size constraints
    between parts (heads and kv_heads, say) fail here rather than after data preparation."""
    top = parse_dataclass(TrainConfig, {k: v for k, v in cfg.items() if k != "hydra"}, "")
    tokenizer = TOKENIZER.config(top.tokenizer, "tokenizer")
    job = TrainJob(
        seed=top.seed,
        device=top.device,
        precision=top.precision,
        cache_dir=top.cache_dir,
        data=CORPUS.config(top.data, "data"),
        tokenizer=tokenizer,
        # the real vocabulary is known after tokenizing; the configured size stands in for the checks
        spec=ModelSpec.from_config(cfg, vocab_size=getattr(tokenizer, "vocab_size", 257)),
        optim=OPTIMIZER.config(top.optim, "optim"),
        sched=SCHEDULE.config(top.sched, "sched"),
        logger=LOGGER.config(top.logger, "logger"),
        loop=top.train,
        distill=top.distill,
    )
    if job.distill.teacher and job.distill.data == "teacher" and job.distill.prompt_tokens > job.spec.model.max_seq_len:
        raise ConfigError(f"distill.prompt_tokens: must be at most model.max_seq_len={job.spec.model.max_seq_len}, "
                          f"got {job.distill.prompt_tokens}")
    if job.loop.batch_tokens is not None:
        micro = job.loop.batch_size * job.spec.model.max_seq_len
        if job.loop.batch_tokens < micro or job.loop.batch_tokens % micro:
            raise ConfigError(f"train.batch_tokens: {job.loop.batch_tokens} is not a multiple of train.batch_size * "
                              f"model.max_seq_len = {micro}")
        job.loop.grad_accum = job.loop.batch_tokens // micro
    from llmlab.model.transformer import check_sizes

    check_sizes(job.spec)
    return job
