"""Data parallel training under ``torchrun``: DDP by default, FSDP2 with ``train.fsdp=true``.

One process per device. Every rank builds the same model from the same seed, draws its slice
of the same global batch (see `RandomWindows`), and steps in lockstep; rank 0 alone writes
logs, metrics and checkpoints. Without ``WORLD_SIZE`` (a plain ``llmlab train``) nothing here
starts a process group and every helper is a no-op.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as tdist
from torch import nn

from llmlab.errors import ConfigError


@dataclass
class Dist:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    fsdp: bool = False
    context: int = 1  # train.context_parallel: consecutive ranks that share each sequence
    context_group: Any = None  # this rank's group of them (a process group), when context > 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def data_rank(self) -> int:
        """Which slice of the global batch this rank's sequences are (ranks sharing a sequence share it)."""
        return self.rank // self.context

    @property
    def data_world(self) -> int:
        """How many slices the global batch is split into."""
        return self.world_size // self.context

    @property
    def context_rank(self) -> int:
        """Which slice of each sequence this rank holds."""
        return self.rank % self.context


def world_from_env() -> Dist:
    """Rank and world size as torchrun (or SLURM's srun with the usual variables) sets them."""
    return Dist(rank=int(os.environ.get("RANK") or 0), local_rank=int(os.environ.get("LOCAL_RANK") or 0),
                world_size=int(os.environ.get("WORLD_SIZE") or 1))


def init_distributed(device: torch.device, fsdp: bool, context: int = 1) -> tuple[Dist, torch.device]:
    """Join the process group torchrun describes: NCCL on CUDA, gloo elsewhere. Each rank
    takes the CUDA device of its local rank. ``context`` (train.context_parallel): groups of
    that many consecutive ranks share each sequence; the groups split the batch."""
    dist = world_from_env()
    dist.fsdp = fsdp and dist.enabled
    # the rank count fits train.context_parallel: check_context_parallel said so in the settings
    dist.context = context
    if not dist.enabled:
        return dist, device
    if device.type == "mps":
        raise ConfigError("device: mps cannot train data-parallel; run one process, or device=cpu under torchrun")
    if device.type == "cuda":
        if dist.local_rank >= torch.cuda.device_count():
            raise ConfigError(f"device: local rank {dist.local_rank} has no GPU; this node has "
                              f"{torch.cuda.device_count()}; lower torchrun's --nproc_per_node")
        device = torch.device("cuda", dist.local_rank)
        torch.cuda.set_device(device)
    if not tdist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs: dict[str, Any] = {"timeout": datetime.timedelta(minutes=30)}
        if device.type == "cuda":
            kwargs["device_id"] = device  # binds NCCL to this GPU at once
        tdist.init_process_group(backend=backend, **kwargs)
    if context > 1:  # every rank makes every group, in the same order
        for first in range(0, dist.world_size, context):
            group = tdist.new_group(list(range(first, first + context)))
            if first == dist.rank - dist.context_rank:
                dist.context_group = group
    return dist, device


def shutdown(dist: Dist, clean: bool = True) -> None:
    """Leave the process group. ``clean``: every rank got here the normal way, so they meet
    at a barrier first and none tears down while another still waits on a collective (after
    an error another rank may never arrive, so then there is no barrier). How a torchrun
    worker then exits: `llmlab.cli.leave_without_finalizing`."""
    if not (dist.enabled and tdist.is_initialized()):
        return
    if clean:
        tdist.barrier()
    tdist.destroy_process_group()


def wrap_model(model: nn.Module, dist: Dist, device: torch.device, find_unused: bool = False) -> nn.Module:
    """The module the training step calls. DDP keeps a full replica per rank and all-reduces
    gradients; FSDP2 shards each block and the embeddings across ranks (``model`` itself
    becomes the sharded module). ``find_unused``: some parameters may get no gradient in a
    step (MoE experts no token was routed to)."""
    if not dist.enabled:
        return model
    if dist.fsdp:
        from torch.distributed.fsdp import fully_shard
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   find_unused_parameters=find_unused)


def gradient_sync(step_model: nn.Module, dist: Dist, sync: bool):
    """Skip the gradient all-reduce on all but the last micro-batch of an accumulated step."""
    if not dist.enabled or sync:
        return contextlib.nullcontext()
    if dist.fsdp:
        step_model.set_requires_gradient_sync(False)
        return _resync(step_model)
    return step_model.no_sync()


@contextlib.contextmanager
def _resync(module):
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)


def mean(value: torch.Tensor, dist: Dist) -> torch.Tensor:
    """The mean of a scalar tensor over ranks (a copy; the input is untouched)."""
    if not dist.enabled:
        return value
    out = value.detach().clone().float()
    tdist.all_reduce(out, op=tdist.ReduceOp.SUM)
    return out / dist.world_size


def any_rank(flag: bool, dist: Dist, device: torch.device) -> bool:
    """True on every rank when it is true on any: all ranks stop at the same step."""
    if not dist.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    return bool(t.item())


def broadcast(obj: Any, dist: Dist) -> Any:
    """Rank 0's value of a picklable object, on every rank."""
    if not dist.enabled:
        return obj
    box = [obj]
    tdist.broadcast_object_list(box, src=0)
    return box[0]


def gather(obj: Any, dist: Dist) -> list[Any]:
    """Every rank's value of a picklable object, in rank order, on every rank."""
    if not dist.enabled:
        return [obj]
    out: list[Any] = [None] * dist.world_size
    tdist.all_gather_object(out, obj)
    return out


def barrier(dist: Dist) -> None:
    if dist.enabled:
        tdist.barrier()


def full_model_state(model: nn.Module, dist: Dist) -> dict[str, torch.Tensor] | None:
    """The whole model's weights on the CPU, on rank 0 (``None`` elsewhere). Under FSDP every
    rank must call this: the shards are gathered."""
    if dist.fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return state if dist.is_main else None
    return {k: v.detach().cpu() for k, v in model.state_dict().items()} if dist.is_main else None


def optimizers_of(optimizer) -> list[torch.optim.Optimizer]:
    return list(getattr(optimizer, "optimizers", [optimizer]))


def full_optimizer_state(model: nn.Module, optimizer, dist: Dist) -> dict | None:
    """The optimizer state keyed by parameter name, whole, on rank 0; every rank must call it
    under FSDP. The same format loads into a single process, DDP or FSDP run."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
    state = get_optimizer_state_dict(model, optimizers_of(optimizer),
                                     options=StateDictOptions(full_state_dict=True, cpu_offload=dist.fsdp))
    return state if dist.is_main else None


def load_optimizer_state(model: nn.Module, optimizer, state: dict) -> None:
    """``state`` (as `full_optimizer_state` saved it) into ``optimizer``; ValueError when what
    landed does not fit (`check_optimizer_state`). A hand-edited state can load without
    complaint yet pair one parameter's moments with another's, and the fused kernels would then
    read past their buffers."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    from llmlab.train.optim.checks import check_optimizer_state, check_same_entries
    saved = state.get("state") if isinstance(state, dict) else None
    if not isinstance(saved, dict):
        raise ValueError("it holds no per-parameter state")
    for name, entry in saved.items():  # before loading, which would pass some of these over
        if not isinstance(entry, dict) or not all(torch.is_tensor(v) for v in entry.values()):
            raise ValueError(f"the state of {name} is not a set of tensors")
    # keyed as the saved state is: without DDP's and torch.compile's wrapper names
    plain = {".".join(part for part in n.split(".") if part not in ("module", "_orig_mod")): p
             for n, p in model.named_parameters()}
    check_same_entries(saved, state.get("param_groups"), plain)
    before = [[dict(g) for g in opt.param_groups] for opt in optimizers_of(optimizer)]
    set_optimizer_state_dict(model, optimizers_of(optimizer), state, options=StateDictOptions(full_state_dict=True))
    names = {id(p): n for n, p in model.named_parameters()}
    for opt, groups in zip(optimizers_of(optimizer), before):
        check_optimizer_state(opt, groups, names)


class WholeOptimizer:
    """An optimizer's whole state as `full_optimizer_state` gathers it (every rank takes part
    in a save), loaded back with `load_optimizer_state` into this run's sharding."""

    def __init__(self, model: nn.Module, optimizer, dist: Dist) -> None:
        self.model, self.optimizer, self.dist = model, optimizer, dist

    def state_dict(self) -> dict | None:
        return full_optimizer_state(self.model, self.optimizer, self.dist)

    def load_state_dict(self, state: dict) -> None:
        load_optimizer_state(self.model, self.optimizer, state)
