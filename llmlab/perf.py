"""Speed figures that say how far to trust them: repeated timings, and how busy the machine was.

A timing means little when other processes took CPU meanwhile. On Linux, ``/proc/stat`` gives
the CPU time that all processes have used; minus this process's own CPU time, over the wall
time and the number of CPUs, it gives the share of the machine that other work used during a
measurement, its *other load*: 0 on an idle machine, 1 when other work kept every core busy
the whole time. Where ``/proc/stat`` does not exist the load is unknown (``None``) and a
figure is not marked either way.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Collection

# Other load above which a speed is marked as measured under contention: other work used more
# than this share of the machine's CPU time while it was measured.
CONTENDED = 0.15


@dataclass(frozen=True)
class CpuSnapshot:
    wall: float  # time.perf_counter()
    busy: float | None  # CPU seconds used by all processes, summed over CPUs (None: unknown)
    own: float  # CPU seconds this process has used, all its threads
    cpus: int


def _busy(fields: list[str], ticks_per_s: float) -> float:
    v = [int(x) for x in fields[1:9]] + [0] * max(0, 9 - len(fields))
    user, nice, system, _idle, _iowait, irq, softirq, steal = v[:8]
    return (user + nice + system + irq + softirq + steal) / ticks_per_s


def parse_proc_stat(text: str, ticks_per_s: float, only: Collection[int] | None = None) -> tuple[float, int]:
    """Busy CPU seconds summed over all CPUs, and the number of CPUs, from the text of
    ``/proc/stat``. Busy is user + nice + system + irq + softirq + steal (time the hypervisor
    gave to other machines counts as taken by others); guest time is already inside user.
    ``only``: the CPUs to count (this process's affinity), from their own lines."""
    busy, cpus, mine = None, 0, 0.0
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if fields[0] == "cpu":
            busy = _busy(fields, ticks_per_s)
        elif fields[0].startswith("cpu") and fields[0][3:].isdigit():
            if only is None:
                cpus += 1
            elif int(fields[0][3:]) in only:
                cpus, mine = cpus + 1, mine + _busy(fields, ticks_per_s)
    if busy is None or cpus == 0:
        raise ValueError("no aggregate 'cpu' line or no per-CPU lines: not the text of /proc/stat")
    return (busy if only is None else mine), cpus


def snapshot(stat_path: str | Path = "/proc/stat", only: Collection[int] | None = None) -> CpuSnapshot:
    """What `other_load` compares: the wall clock, the busy time of the machine's CPUs (``only``:
    of those CPUs) and this process's CPU time."""
    wall, own = time.perf_counter(), time.process_time()
    try:
        busy, cpus = parse_proc_stat(Path(stat_path).read_text(), os.sysconf("SC_CLK_TCK"), only)
    except (OSError, ValueError, AttributeError):
        busy, cpus = None, len(only) if only else os.cpu_count() or 1
    return CpuSnapshot(wall, busy, own, cpus)


def other_load(start: CpuSnapshot, end: CpuSnapshot) -> float | None:
    """The share of the machine's CPU time that other processes used between two snapshots,
    clipped to [0, 1] (the counters tick in 1/100 s, so a short interval is coarse)."""
    if start.busy is None or end.busy is None or end.wall <= start.wall:
        return None
    others = (end.busy - start.busy) - (end.own - start.own)
    return min(1.0, max(0.0, others / ((end.wall - start.wall) * end.cpus)))


def contended(load: float | None) -> bool:
    return load is not None and load > CONTENDED


@dataclass(frozen=True)
class Rate:
    """A rate from repeated timings: the median, the relative spread (half the interquartile
    range over the median; 0 for fewer than 3 timings), how many timings, and the other load
    while they were taken."""
    median: float
    spread: float
    n: int
    other_load: float | None

    @property
    def contended(self) -> bool:
        return contended(self.other_load)

    def as_dict(self, prefix: str) -> dict[str, float | int | bool | None]:
        return {prefix: self.median, f"{prefix}_spread": round(self.spread, 4), f"{prefix}_n": self.n,
                f"{prefix}_other_load": None if self.other_load is None else round(self.other_load, 3)}


def rate(values: list[float], load: float | None) -> Rate:
    if not values:
        return Rate(0.0, 0.0, 0, load)
    med = statistics.median(values)
    spread = 0.0
    if len(values) >= 3 and med > 0:
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
        spread = (q3 - q1) / 2 / med
    return Rate(med, spread, len(values), load)


def describe(r: Rate, unit: str = "tok/s") -> str:
    """``3,105 tok/s ±2% (5 timings)``, with the contention said where there was some."""
    text = f"{r.median:,.0f} {unit}"
    if r.n >= 3:
        text += f" ±{r.spread:.0%}"
    if r.contended:
        text += f", contended: other work used {r.other_load:.0%} of the CPU"
    return text


def is_number(value) -> bool:
    """An int or float, not a bool: what a record read back from a file (metrics.jsonl,
    state.json) must hold where a figure belongs."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_count(value) -> bool:
    """An int >= 0, not a bool: a count of tokens, bytes, documents or positions read back."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_seconds(value) -> bool:
    """A finite number >= 0: a duration read back."""
    return is_number(value) and math.isfinite(value) and value >= 0
