"""The typed ``train`` config: every section checked before any work starts. No torch at
import (``--cfg job`` and a mistake's one-line error need none); the checks that build parts
import it."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from llmlab.data.corpus import CORPUS
from llmlab.data.tokenizer import TOKENIZER
from llmlab.errors import ConfigError
from llmlab.model.config import ModelSpec
from llmlab.names import DEFAULT_STEPS, parse_flops, run_id
from llmlab.registry import INT64, Checked, bounded, choice, declared_groups, parse_dataclass, section, with_groups
from llmlab.train.device import PRECISIONS
from llmlab.train.loggers import LOGGER
from llmlab.train.optim_config import OPTIMIZER
from llmlab.train.schedule import SCHEDULE

#: the whole config groups declared as packages under llmlab/train/groups (``probe``...)
GROUPS = declared_groups("llmlab.train.groups")

HEAD_LOSS = ("auto", "fused", "plain")  # train.head_loss


@dataclass
class LoopConfig(Checked):
    """The ``train`` section."""

    steps: int = bounded(DEFAULT_STEPS, at_least=1)  # the default run: 1.5M tokens, about 2.5 minutes on 2 CPU cores
    batch_size: int = bounded(8, at_least=1)
    grad_accum: int = bounded(1, at_least=1)
    batch_tokens: int | None = None  # tokens per optimizer step; when set, grad_accum = batch_tokens / (batch_size * max_seq_len)
    grad_clip: float = bounded(1.0, at_least=0)  # max global gradient norm; 0 turns clipping off
    ema: float = bounded(0.0, at_least=0, below=1)  # decay of a moving average of the weights (0: none), saved and scored beside them
    z_loss: float = bounded(0.0, at_least=0)  # PaLM's auxiliary loss, z_loss * log(Z)^2 per token: keeps the logits' normaliser near 1
    log_every: int = bounded(10, at_least=1)
    eval_every: int = bounded(200, at_least=0)  # 0: only at the end
    eval_windows: int = bounded(64, at_least=0)  # validation windows per periodic eval (`llmlab eval` scores the whole split)
    ckpt_every: int = bounded(200, at_least=0)  # 0: only at the end
    keep_checkpoints: int = bounded(2, at_least=0)
    compile: bool = False  # torch.compile the model
    activation_checkpointing: str = choice("none", ("none", "full", "selective"))  # recompute each block's forward in the backward, for long contexts; full keeps its input only, selective its matmuls' and attention's outputs too
    prompts: list[str] = field(default_factory=lambda: ["def ", "class ", "import "])
    eval_tasks: list[str] = field(default_factory=list)  # multiple-choice task files scored at each evaluation (as llmlab eval tasks=)
    sample_tokens: int = bounded(48, at_least=0)  # tokens completed per prompt at each eval
    resume: str | None = "auto"  # auto: continue from this run dir's latest checkpoint; a checkpoint path; null: fresh
    resume_weights_only: bool = False  # a checkpoint without trainer.pt: continue from its weights, fresh optimizer
    max_tokens: int | None = bounded(None, above=0)  # the run's length in tokens (replaces steps; the schedule spans it)
    max_flops: Any = None  # the run's length in training FLOPs (6e15 or 1e15*6), by the model card's FLOPs/token; replaces steps
    max_steps: int | None = bounded(None, above=0)  # stop at this step and save a checkpoint; the schedule still spans steps (resume later)
    max_time: float | None = bounded(None, at_least=0)  # seconds; stop and save a checkpoint once training has run this long
    fsdp: bool = False  # under torchrun: FSDP2 (shard params, grads, optimizer state) instead of DDP
    context_parallel: int = bounded(1, at_least=1)  # under torchrun: ranks that share each sequence (ring attention); data parallel over the rest
    head_loss: str = choice("auto", HEAD_LOSS)  # fused: LM head + cross-entropy in chunks, no logits kept; auto: fused where a micro-batch has >= 4M logits, not in fp16

    def check(self, prefix: str) -> None:
        budget = self.flops_budget(prefix)
        if budget is not None and self.max_tokens is not None:
            raise ConfigError(f"{prefix}.max_flops: set either max_flops or max_tokens (both set the run's length), "
                              f"not both: max_flops={budget:.3g}, max_tokens={self.max_tokens}")
        if self.steps != LoopConfig.steps and (budget is not None or self.max_tokens is not None):
            # the budget sets the run's length: steps= was passed over in silence
            length = f"max_flops={budget:.3g}" if budget is not None else f"max_tokens={self.max_tokens}"
            raise ConfigError(f"{prefix}.steps: set either steps or a budget (max_flops, max_tokens), not both: "
                              f"steps={self.steps}, {length}; max_steps= stops a budgeted run early")
        if self.batch_tokens is not None and self.grad_accum != 1:  # batch_tokens sets the accumulation
            raise ConfigError(f"{prefix}.grad_accum: set either grad_accum or batch_tokens (which sets it), not both: "
                              f"grad_accum={self.grad_accum}, batch_tokens={self.batch_tokens}")

    def flops_budget(self, prefix: str = "train") -> float | None:
        """``max_flops`` as a number (it may be written ``1e15*6``); None: no budget."""
        return None if self.max_flops is None else parse_flops(self.max_flops, f"{prefix}.max_flops")

    def planned_steps(self, tokens_per_step: int, flops_per_token: int) -> int:
        """Optimizer steps of the run: enough to cover ``max_tokens`` or ``max_flops`` (the
        last step may pass it by less than a step), else ``steps``."""
        if self.max_tokens:
            return math.ceil(self.max_tokens / tokens_per_step)
        budget = self.flops_budget()
        if budget is not None:
            per_step = flops_per_token * tokens_per_step
            if budget < per_step:
                raise ConfigError(f"train.max_flops: {budget:.3g} is less than one step, which takes "
                                  f"{per_step:.3g} FLOPs ({flops_per_token:,} FLOPs/token x {tokens_per_step:,} "
                                  "tokens/step)")
            steps = math.ceil(budget / per_step)
            if steps >= INT64:  # 1e40: a run that never ends, and a step count no tensor holds
                raise ConfigError(f"train.max_flops: {budget:.3g} is {steps:.3g} steps of {per_step:.3g} FLOPs, "
                                  f"past the {INT64 - 1:,} a run can count; give a smaller budget")
            return steps
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
class TrainConfig(Checked):
    """``llmlab train``'s whole config: the run's own settings, and one section per part,
    filled by the config groups (``model/attention=gqa`` puts GQA's settings under ``attention``)."""

    seed: int = bounded(1337, at_least=0)  # numpy's generators take no negative seed
    device: str = "auto"  # auto (cuda > mps > cpu) | cpu | cuda | cuda:N | mps
    precision: str = choice("auto", PRECISIONS)  # auto: bf16 on CUDA GPUs that have it and on CPUs with bf16 units (AMX, AVX-512 BF16), else fp32; fp16 is loss-scaled
    cache_dir: str | None = None  # prepared data; null: $LLMLAB_CACHE or .cache/llmlab
    init: str | None = None  # start from these weights: an llmlab checkpoint or run, or a transformers directory (its network and tokenizer; a fresh optimizer at step 0)
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
        from llmlab.train.device import check_device

        check_device(self.device)  # an unknown or absent device is a config mistake




@dataclass(frozen=True)
class TrainJob:
    """What ``llmlab train`` runs: the composed config resolved once into typed parts, with
    every value derived from the settings (``grad_accum`` from ``train.batch_tokens``, the
    FLOP budget as a number) computed here. ``config`` keeps the settings as the user wrote
    them (resolved by Hydra): the run's ``config.yaml``, its run id and its checkpoints'
    record of what trained them. Data preparation, the model builder, the optimizer and the
    checkpoints take their typed part from here; nothing downstream parses the config again."""

    seed: int
    device: str
    precision: str
    cache_dir: str | None
    data: Any
    tokenizer: Any
    spec: ModelSpec  # with the configured vocabulary; the trainer sets the prepared one
    optim: Any
    sched: Any
    logger: Any
    loop: LoopConfig
    distill: DistillConfig
    grad_accum: int  # micro-batches per optimizer step: train.batch_tokens / (batch_size x max_seq_len), else train.grad_accum
    max_flops: float | None  # train.max_flops as a number
    config: Mapping[str, Any]
    init: Any = None  # init=: the `llmlab.train.init.InitSource` the weights come from
    composed: Mapping[str, Any] | None = None  # with init=: the config as composed, before the source's sections replaced its own
    declared: Mapping[str, Any] = field(default_factory=dict)  # each declared group's typed Config (`GROUPS`), by section

    @property
    def run_id(self) -> str:
        """What the run trains, hashed: a declared group's section stays out where its parts
        only watch the run, or where it is the group's default (so a group added later leaves
        every earlier run's id, and its resume, as it was)."""
        kept = dict(self.config)
        for registry in GROUPS:
            name = registry.group
            if registry.watches or self.declared.get(name) == registry.default_config():
                kept.pop(name, None)
        return run_id(kept)

    def with_logger_group(self, group: str) -> "TrainJob":
        """The job with ``logger.group`` set (a sweep's jobs share one group), in both its
        typed logger and the settings it records."""
        config = {**self.config, "logger": {**dict(self.config.get("logger") or {}), "group": group}}
        return replace(self, logger=replace(self.logger, group=group), config=config)


def check_train_config(cfg: Mapping[str, Any]) -> TrainJob:
    """Resolve a composed ``train`` config into its `TrainJob`, checking every section; the
    first problem is a ConfigError that names its key. Also builds a block's parts on the meta
    device, so size constraints between parts (heads and kv_heads, say) fail here rather than
    after data preparation."""
    cfg = {k: v for k, v in cfg.items() if k != "hydra"}
    schema = with_groups(TrainConfig, GROUPS)
    top = parse_dataclass(schema, cfg, "")
    source, composed = None, None
    if top.init:  # the source's network and tokenizer replace the composed ones (`llmlab.train.init`)
        from llmlab.train.init import init_source, with_init

        source, composed = init_source(top.init), cfg
        cfg = with_init(cfg, source)
        top = parse_dataclass(schema, cfg, "")
    # a run's settings written before a group existed have no section of it: the group's default
    declared = {r.group: (r.config(getattr(top, r.group), r.group) if getattr(top, r.group) is not None
                          else r.default_config()) for r in GROUPS}
    tokenizer = TOKENIZER.config(top.tokenizer, "tokenizer")
    # the real vocabulary is known after tokenizing; the tokenizer's planned size stands in for the checks
    vocab = source.spec["vocab_size"] if source else TOKENIZER.get(tokenizer.kind).planned_vocab(tokenizer)
    spec = ModelSpec.from_config(cfg, vocab_size=vocab)
    data, optim = CORPUS.config(top.data, "data"), OPTIMIZER.config(top.optim, "optim")
    sched, logger = SCHEDULE.config(top.sched, "sched"), LOGGER.config(top.logger, "logger")
    loop, distill = top.train, top.distill
    if getattr(data, "doc_mask", False) and getattr(tokenizer, "eos", "") is None:  # before the data is prepared
        raise ConfigError("data.doc_mask: tokenizer.eos=null marks no document's end, so no boundary can be kept; "
                          "name the tokenizer's end-of-document token in tokenizer.eos, or drop data.doc_mask")
    if distill.teacher and distill.data == "teacher" and distill.prompt_tokens > spec.model.max_seq_len:
        raise ConfigError(f"distill.prompt_tokens: must be at most model.max_seq_len={spec.model.max_seq_len}, "
                          f"got {distill.prompt_tokens}")
    if spec.model.parametrization == "mup" and not getattr(type(optim), "mup", False):
        allowed = [name for name in OPTIMIZER.names() if getattr(OPTIMIZER.config_of(name), "mup", False)]
        raise ConfigError(f"model.parametrization: mup scales per-layer learning rates by Adam's rules, which do not hold for "
                          f"optim={optim.kind}; allowed with mup: {', '.join(allowed)}")
    grad_accum = loop.grad_accum
    if loop.batch_tokens is not None:
        micro = loop.batch_size * spec.model.max_seq_len
        if loop.batch_tokens < micro or loop.batch_tokens % micro:
            raise ConfigError(f"train.batch_tokens: {loop.batch_tokens} is not a multiple of train.batch_size * "
                              f"model.max_seq_len = {micro}")
        grad_accum = loop.batch_tokens // micro
    check_branch_ends(loop, sched)
    check_optimizer_fits(top.precision, loop, optim)
    check_head_loss(loop, spec)
    if loop.eval_tasks:  # a malformed task file is one line before any work
        from llmlab.eval.tasks import read_task
        from llmlab.model.objective import OBJECTIVE

        if not OBJECTIVE.get(spec.objective.kind, "objective").causal:
            raise ConfigError(f"train.eval_tasks: objective={spec.objective.kind} scores no continuation; tasks need "
                              "objective=clm")
        for path in loop.eval_tasks:
            read_task(path, "train.eval_tasks")
    from llmlab.model.transformer import check_sizes

    check_sizes(spec)
    if loop.context_parallel > 1:
        check_context_parallel(loop, spec, distill, data)
    return TrainJob(seed=top.seed, device=top.device, precision=top.precision, cache_dir=top.cache_dir,
                    data=data, tokenizer=tokenizer, spec=spec, optim=optim, sched=sched, logger=logger, loop=loop,
                    distill=distill, grad_accum=grad_accum, max_flops=loop.flops_budget(), config=cfg, init=source,
                    composed=composed, declared=declared)


def check_optimizer_fits(precision: str, loop: LoopConfig, optim) -> None:
    """What fp16's loss scaling and FSDP ask of the optimizer and the head's loss: one
    optimizer (a kind that declares ``several``, as muon does, is two), and logits whose
    gradients the scaler can still protect."""
    import os

    several = getattr(type(optim), "several", False)
    if precision == "fp16" and several:
        raise ConfigError(f"precision: fp16 loss scaling needs a single optimizer; optim={optim.kind} has "
                          "several; use precision=bf16 or fp32")
    if loop.head_loss == "fused" and precision == "fp16":
        raise ConfigError("train.head_loss: fused computes the logits' gradients in the forward, before fp16 "
                          "loss scaling could protect them; use train.head_loss=auto or plain, or precision=bf16")
    if loop.fsdp and several and int(os.environ.get("WORLD_SIZE") or 1) > 1:  # in one process nothing is sharded
        raise ConfigError(f"train.fsdp: optim={optim.kind} is not supported with FSDP; use DDP "
                          "(train.fsdp=false) or optim=adamw")
    if loop.fsdp and loop.ema and int(os.environ.get("WORLD_SIZE") or 1) > 1:
        raise ConfigError(f"train.ema: {loop.ema:g} keeps a whole copy of the weights on every rank, which FSDP "
                          "shards; use DDP (train.fsdp=false) or train.ema=0")


def check_head_loss(loop: LoopConfig, spec) -> None:
    """The fused head loss never holds the logits, which the z-loss and the logit cap read."""
    if loop.head_loss != "fused":
        return
    for key, on in (("train.z_loss", loop.z_loss), ("model.logit_softcap", spec.model.logit_softcap)):
        if on:
            raise ConfigError(f"train.head_loss: fused never holds the logits, which {key}={on} reads; use "
                              "train.head_loss=auto or plain")


def check_branch_ends(loop: LoopConfig, sched) -> None:
    """Where a cooldown branch's end can be placed before any work: a branch in steps against
    a run whose length is ``train.steps`` (its end, its warm-up), a branch in FLOPs against
    ``train.max_flops``. The rest waits for the model's FLOPs per token
    (`llmlab.train.branches.plan`)."""
    from llmlab.train.schedule import warmup_steps

    budget = loop.flops_budget()
    if budget is None and loop.max_tokens is None and sched.branches:
        for end in sched.branches:
            if end >= loop.steps:
                raise ConfigError(f"sched.branches: {end} is not before the run's end (train.steps={loop.steps}); a "
                                  "branch ends before the run it leaves")
        warmup = warmup_steps(sched, loop.steps)
        if min(sched.branches) <= warmup:
            raise ConfigError(f"sched.branches: {min(sched.branches)} ends within the warm-up of {warmup} steps; a "
                              "branch leaves the constant rate after it")
    if budget is not None:
        for number in sched.branch_budgets():
            if number >= budget:
                raise ConfigError(f"sched.branch_flops: {number:.3g} is not below the run's budget train.max_flops="
                                  f"{budget:.3g}; a branch ends before the run it leaves")


def check_context_parallel(loop: LoopConfig, spec: ModelSpec, distill: DistillConfig, data) -> None:
    """What ``train.context_parallel`` can split: one line naming the first setting it cannot
    train with."""
    from llmlab.model.config import ATTENTION, POSITION

    n, key = loop.context_parallel, "train.context_parallel"
    if spec.model.max_seq_len % n:
        raise ConfigError(f"{key}: model.max_seq_len={spec.model.max_seq_len} is not divisible by {n} ranks; "
                          f"each rank holds an equal slice of the sequence")
    supported = [name for name in ATTENTION.names() if ATTENTION.get(name).context_parallel]
    if spec.attention.kind not in supported:
        raise ConfigError(f"{key}: model/attention={spec.attention.kind} cannot split its sequence across ranks; "
                          f"allowed: {', '.join(supported)}")
    refused = [(not POSITION.get(spec.pos.kind).context_parallel, f"pos={spec.pos.kind} (its score bias is not split)"),
               (spec.model.mtp_heads > 0, "model.mtp_heads (their targets cross the slices)"),
               (bool(distill.teacher), "distill.teacher (the teacher reads whole sequences)"),
               (loop.fsdp, "train.fsdp (context parallel runs with DDP)"),
               (loop.compile, "train.compile (the ring's messages break the graph)"),
               (data.doc_mask, "data.doc_mask (the ring attends without a mask)"),
               (loop.activation_checkpointing != "none",
                f"train.activation_checkpointing={loop.activation_checkpointing} (a recomputed block would send "
                "the ring's messages again)")]
    for bad, what in refused:
        if bad:
            raise ConfigError(f"{key}: {n} cannot be combined with {what}; set {key}=1 or change it")
    world = int(os.environ.get("WORLD_SIZE") or 1)  # torchrun's; 1 in a plain process
    if world % n:
        how = (f"it runs in one process; start {n} (or a multiple) with torchrun --nproc_per_node={n}" if world == 1
               else f"torchrun started {world} ranks")
        raise ConfigError(f"{key}: {n} ranks share each sequence, so the ranks must be a multiple of {n}; {how}")
