"""How many threads a decoding step on the CPU runs on (``llmlab sample threads=auto``).

A step that decodes one token is a chain of small products, each split over torch's
intra-op threads, and each split waits for its slowest thread. When other processes hold
some of the cores, that thread waits for the scheduler to give it one, and the whole step
with it: beside a training on 2 cores, a d 512 x 8 model decoded 25 tokens/s on 2 threads
and 64 on 1, a d 192 x 4 one 68 and 235.

So while it decodes, `ThreadPicker` reads how much of this process's CPUs other processes
used (`llmlab.perf.other_load`, from ``/proc/stat``, over the CPUs this process may run on)
every `INTERVAL` seconds, and runs the steps on the cores they left: all threads times the
share left, rounded, at least 1. On an idle machine that is all threads, as before; it
costs one read of ``/proc/stat`` per `INTERVAL`. Where ``/proc/stat`` cannot be read (not
Linux), every step runs on all threads.

Timing the counts against each other instead was tried and kept the wrong one too often:
beside a training, a step on 2 threads takes 10 ms or 100 ms by the luck of the scheduler,
and a few timings cannot tell which is usual.

A token's products give the same numbers on any thread count (each output is summed by one
thread); PyTorch's CPU attention for one query may split a long cache over threads, so
logits can differ in their last bits between counts. ``threads=N`` decodes every step on N
threads.
"""

from __future__ import annotations

import collections
import os
import time
from typing import Any, Callable

import torch

from llmlab.perf import CpuSnapshot, other_load, snapshot

INTERVAL = 0.25  # seconds between readings of the load (/proc/stat counts in 10 ms ticks)


def cores_left(most: int, load: float) -> int:
    """The thread count for ``most`` threads when others use ``load`` of the CPUs: the share
    they left, rounded half up, at least 1."""
    return max(1, min(most, int(most * (1.0 - load) + 0.5)))


def _own_cpus() -> set[int] | None:
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):  # not Linux
        return None


class ThreadPicker:
    """Sets torch's thread count for each one-token step of a decoding (`before`), from the
    load that other processes put on this process's CPUs since the last reading. Build it
    with `for_decoding` (as early as may be: the first reading covers the time since);
    `restore` puts the count back."""

    def __init__(self, most: int, read: Callable[[], CpuSnapshot] | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        cpus = _own_cpus()
        self.read = read or (lambda: snapshot(only=cpus))  # its wall time is ``clock``'s
        self.clock = clock
        self.most = most
        self.found = torch.get_num_threads()  # what `restore` puts back
        self.current = most
        self.last = self.read()
        self.busiest: float | None = None  # the highest other load read
        self.steps: collections.Counter[int] = collections.Counter()  # steps decoded on each count

    @classmethod
    def for_decoding(cls, device: torch.device, setting: Any = "auto") -> "ThreadPicker | None":
        """None where nothing is chosen: a setting other than "auto" (``llmlab sample threads=N``
        sets the count for the whole command), another device than the CPU, or one thread."""
        if setting != "auto" or device.type != "cpu" or torch.get_num_threads() < 2:
            return None
        return cls(torch.get_num_threads())

    def _update(self) -> None:
        if self.clock() - self.last.wall < INTERVAL:  # the file is read only then (a step at 1.7M takes 2 ms)
            return
        now = self.read()
        load, self.last = other_load(self.last, now), now
        if load is not None:
            self.busiest = max(load, self.busiest or 0.0)
            self.current = cores_left(self.most, load)

    def prefill(self) -> None:
        """Called before a step over many tokens (the prompt, a refill): sets its thread count."""
        self._update()
        if torch.get_num_threads() != self.current:
            torch.set_num_threads(self.current)

    def before(self) -> None:
        """Called before a one-token step: sets its thread count, and counts the step."""
        self.prefill()
        self.steps[self.current] += 1

    def restore(self) -> None:
        """The thread count as it was when the picker was made."""
        if torch.get_num_threads() != self.found:
            torch.set_num_threads(self.found)

    def said(self) -> str:
        """The counts the steps ran on, most used first, and the other load that made them:
        "2 threads", or "1 thread for 180 of 199 steps, 2 for 19 (other processes used up to
        96% of the CPUs)"."""
        total = sum(self.steps.values())
        if not total:
            return f"{self.most} threads"
        (top, n), *rest = self.steps.most_common()
        head = f"{top} thread{'s' * (top != 1)}"
        if not rest and top == self.most:
            return head
        busy = f" (other processes used up to {self.busiest:.0%} of the CPUs)" if self.busiest is not None else ""
        if not rest:
            return f"{head} of {self.most}{busy}"
        return f"{head} for {n} of {total} steps, " + ", ".join(f"{c} for {k}" for c, k in rest) + busy
