"""Experiment loggers (config group ``logger``). A logger never stops a run: any error it
raises is reported once and the logger switches itself off. Each kind is one file in this
package, its class registered with ``@LOGGER.register(name)`` and holding its nested
``Config``; the package finds them all (`llmlab.registry.discover`)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmlab import console
from llmlab.files import atomic_write_bytes, atomic_write_text, open_append
from llmlab.registry import Registry, discover

LOGGER = Registry("logger", group="logger")


class Logger:
    #: its Config has ``group``, which a sweep fills so that its runs' curves overlay
    groups_runs = False

    @dataclass
    class Config:
        kind: str = ""

    def __init__(self, cfg):
        self.cfg = cfg

    def start(self, run_dir: Path, config: dict) -> None: ...

    def log(self, metrics: dict[str, Any], step: int) -> None: ...

    def log_samples(self, samples: list[tuple[str, str]], step: int) -> None: ...

    def finish(self) -> None: ...


class SafeLogger:
    """Wraps a logger so a failure in it is reported once and then ignored."""

    def __init__(self, inner: Logger):
        self.inner = inner
        self.dead = False

    def _call(self, what: str, *args) -> None:
        if self.dead:
            return
        try:
            getattr(self.inner, what)(*args)
        except Exception as e:  # logging must never end a run
            self.dead = True
            console.err.print(f"logger {self.inner.cfg.kind}: {what} failed ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}); logging to it is off for this run",
                              style="yellow")

    def start(self, run_dir, config):
        self._call("start", run_dir, config)

    def log(self, metrics, step):
        self._call("log", metrics, step)

    def log_samples(self, samples, step):
        self._call("log_samples", samples, step)

    def finish(self):
        self._call("finish")


class JsonlWriter:
    """Every metric record, one JSON object a line, flushed as written."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.file = open_append(self.path, buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps({"time": round(time.time(), 3), **record}) + "\n")

    def close(self) -> None:
        self.file.close()

    @staticmethod
    def truncate_after(path: Path, step: int) -> list[dict]:
        """Drop the records after ``step``: a resumed run logs those steps again. Returns the
        records kept."""
        path = Path(path)
        if not path.is_file():
            return []
        data = path.read_bytes()
        lines = data.split(b"\n")
        kept, records, bad = [], [], []
        for number, raw in enumerate(lines, 1):
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
                record = json.loads(text)
                if not isinstance(record, dict) or isinstance(record.get("step", 0), bool) \
                        or not isinstance(record.get("step", 0), (int, float)):
                    raise ValueError("not a record with a numeric step")
            except ValueError:  # UnicodeDecodeError included
                if number < len(lines):  # the unterminated last line is one a crash cut short
                    bad.append(number)
                continue
            if record.get("step", 0) > step:
                continue
            kept.append(text + "\n")
            records.append(record)
        if bad:  # kept whole beside it, never dropped without a word
            aside = path.with_name(f"{path.name}.damaged")
            atomic_write_bytes(aside, data)
            shown = ", ".join(map(str, bad[:5])) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
            console.err.print(f"{path}: {len(bad)} line(s) that are not JSON records (line {shown}) are left out; "
                              f"the file as it was is kept as {aside}", style="yellow")
        atomic_write_text(path, "".join(kept))
        return records


discover(__name__, __path__)  # every kind's file, each registering itself
