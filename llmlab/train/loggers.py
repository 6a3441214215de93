"""Experiment loggers (config group ``logger``). A logger never stops a run: any error it
raises is reported once and the logger switches itself off."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmlab import console
from llmlab.files import atomic_write_bytes, atomic_write_text, open_append, own_dir
from llmlab.registry import Registry, choice

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


@LOGGER.register("none")
class NoLogger(Logger):
    """No experiment tracker; metrics.jsonl in the run directory is always written."""

    @dataclass
    class Config:
        kind: str = "none"


@LOGGER.register("wandb")
class WandbLogger(Logger):
    """Weights & Biases. ``mode: auto`` is online when an API key is set and the service
    answers, offline otherwise; offline runs live in the run directory (``wandb sync``)."""

    groups_runs = True

    @dataclass
    class Config:
        kind: str = "wandb"
        project: str = "llmlab"
        entity: str | None = None
        name: str | None = None
        group: str | None = None
        tags: list[str] = field(default_factory=list)
        mode: str = choice("auto", ("auto", "online", "offline", "disabled"))  # auto: WANDB_MODE if set, else online with an API key
        init_timeout: float = 30.0

    def start(self, run_dir: Path, config: dict) -> None:
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        mode = self.cfg.mode
        env_mode = os.environ.get("WANDB_MODE")
        if env_mode is not None and env_mode not in WANDB_ENV_MODES:  # wandb's Settings refuse it: no logging at all
            os.environ.pop("WANDB_MODE")
            console.err.print(f"wandb: WANDB_MODE={env_mode!r} is not a mode wandb knows "
                              f"({', '.join(WANDB_ENV_MODES)}); left out, logger.mode decides", style="yellow",
                              highlight=False)
            env_mode = None
        if mode == "auto":  # wandb's own variable first, as wandb itself reads it; then the API key
            mode = ({"dryrun": "offline", "run": "online", "shared": "online"}.get(env_mode, env_mode) if env_mode
                    else "online" if os.environ.get("WANDB_API_KEY") else "offline")
        own_dir(Path(run_dir) / "wandb", "logger")  # wandb writes its folder there: never through a link out
        kwargs = dict(project=self.cfg.project, entity=self.cfg.entity, name=self.cfg.name or Path(run_dir).name,
                      group=self.cfg.group, tags=list(self.cfg.tags) or None, config=config, dir=str(run_dir))
        try:
            self.run = wandb.init(mode=mode, settings=wandb.Settings(init_timeout=self.cfg.init_timeout), **kwargs)
        except Exception as e:  # no network, bad key: keep the curves locally
            if mode != "online":
                raise
            console.err.print(f"wandb: online start failed ({type(e).__name__}); logging offline", style="yellow")
            mode = "offline"
            self.run = wandb.init(mode=mode, **kwargs)
        self.mode = mode
        self.run.define_metric("val/*", step_metric="train/step")
        where = getattr(self.run, "dir", run_dir)
        if mode == "offline":
            console.err.print(f"wandb: offline run; upload later with `wandb sync {Path(where).parent}`")
        elif mode == "online":
            console.err.print(f"wandb: {self.run.url}")
        else:
            console.err.print("wandb: disabled, nothing is logged to it (logger=none leaves wandb out entirely)")

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.run.log({**metrics, "train/step": step}, step=step)

    def log_samples(self, samples: list[tuple[str, str]], step: int) -> None:
        import wandb
        table = wandb.Table(columns=["step", "prompt", "completion"], data=[[step, p, c] for p, c in samples])
        self.run.log({"samples": table}, step=step)

    def finish(self) -> None:
        self.run.finish()


# the values of WANDB_MODE that wandb's settings accept
WANDB_ENV_MODES = ("online", "offline", "disabled", "dryrun", "run", "shared")


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
