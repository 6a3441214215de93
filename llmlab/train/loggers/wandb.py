"""``logger=wandb``: Weights & Biases, online or offline."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmlab import console
from llmlab.files import own_dir
from llmlab.registry import choice
from llmlab.train.loggers import LOGGER, Logger

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
