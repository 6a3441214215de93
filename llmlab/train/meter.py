"""Measuring a run as it goes: the log window (losses summed on the device, the time and the
machine's other load it took), the records it becomes, and the live progress bar."""

from __future__ import annotations

import time
from typing import Any

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Column

from llmlab.perf import is_number as _number, other_load, snapshot
from llmlab.train.distributed import mean


class LogWindow:
    """The training steps since the last log line. Losses stay tensors on the device (no
    sync per step); ``close`` reduces them over ranks and starts the next window. A resume in
    mid-interval carries the interval's sums on (`state_dict` at the save, `load_state_dict` at
    the resume), so its average covers the whole interval, as an uninterrupted run's does."""

    def __init__(self, device: torch.device, dist):
        self.device, self.dist = device, dist
        self.load_state_dict({})

    def load_state_dict(self, carried: dict) -> None:
        self.loss = torch.tensor(float(carried.get("loss", 0.0)), device=self.device)
        self.micro = int(carried.get("micro", 0))
        self.extra: dict[str, Any] = {k: float(v) for k, v in (carried.get("extra") or {}).items()}
        self.restart_clock()

    def restart_clock(self) -> None:
        self.t0, self.steps, self.cpu = time.perf_counter(), 0, snapshot()

    def add(self, metrics: dict[str, torch.Tensor]) -> None:
        """One micro-batch's metrics: ``loss/main`` and the rest (MoE balance, MTP, KL)."""
        self.loss += metrics["loss/main"].detach()
        self.micro += 1
        for key, value in metrics.items():
            if key != "loss/main":
                self.extra[key] = self.extra.get(key, 0.0) + (value.detach() if torch.is_tensor(value) else value)

    def stepped(self) -> None:
        self.steps += 1

    def pause(self, fn, *args, **kwargs):
        """Run ``fn`` (an eval, a save) without counting its time as training time."""
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.t0 += time.perf_counter() - t

    def state_dict(self) -> dict:
        """The window's sums so far, for a checkpoint (empty when the window is)."""
        if not self.micro:
            return {}
        return {"loss": float(mean(self.loss, self.dist)), "micro": self.micro,
                "extra": {k: float(mean(torch.as_tensor(v, device=self.device), self.dist))
                          for k, v in sorted(self.extra.items())}}

    def close(self) -> dict[str, Any]:
        """The window's mean losses (over micro-batches and ranks), its length in seconds and
        steps, and the other load while it ran; the next window starts empty."""
        seconds = time.perf_counter() - self.t0
        out = {"seconds": seconds, "steps": self.steps, "other_load": other_load(self.cpu, snapshot()),
               "loss": float(mean(self.loss, self.dist)) / self.micro,
               "extra": {k: float(mean(torch.as_tensor(v, device=self.device), self.dist)) / self.micro
                         for k, v in sorted(self.extra.items())}}
        self.loss, self.micro, self.extra = torch.zeros((), device=self.device), 0, {}
        self.restart_clock()
        return out


class History:
    """Every record of the run (those before a resume included) and the timed windows'
    speeds and loads, for the summary. The first window holds warm-up and compilation, so
    its speed is not timed."""

    def __init__(self, previous: list[dict], log_every: int):
        self.records: list[dict] = list(previous)
        # ``previous``: metrics.jsonl's records before a resume, a file a hand may have edited
        self.rates: list[float] = [h["perf/tokens_per_s"] for h in previous
                                   if _number(h.get("perf/tokens_per_s")) and _number(h.get("step"))
                                   and h["step"] > log_every]
        self.loads: list[tuple[float, float]] = []

    def timed(self, tokens_per_s: float, seconds: float, load: float | None) -> None:
        self.rates.append(tokens_per_s)
        if load is not None:
            self.loads.append((seconds, load))


def train_progress(out, total: int) -> Progress:
    """The live bar: step N/M, elapsed time and the loss come first and keep their width (at
    80 columns too); the time left and the rest of the status line take what is left and are
    cut with an ellipsis. A log file gets a line per log step instead."""
    def keep(width: int) -> Column:
        return Column(no_wrap=True, min_width=width)
    return Progress(TextColumn("[bold]train", table_column=keep(5)), BarColumn(bar_width=8, table_column=keep(8)),
                    MofNCompleteColumn(table_column=keep(2 * len(str(total)) + 1)),
                    TimeElapsedColumn(table_column=keep(7)), TextColumn("{task.fields[loss]}", table_column=keep(10)),
                    TimeRemainingColumn(table_column=Column(no_wrap=True, overflow="ellipsis")),
                    TextColumn("{task.fields[status]}", table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1)),
                    console=out, disable=not out.is_terminal)
