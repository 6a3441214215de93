"""llmlab train: token shards -> model checkpoints, metrics, logs. Under -m, each job is one
run of the sweep (llmlab.train.sweep)."""

from pathlib import Path

from llmlab.train.settings import TrainConfig as SCHEMA
from llmlab.train.settings import check_train_config


def validate(cfg: dict) -> None:
    check_train_config(cfg)


def help_settings() -> list[str]:
    """The run's own settings, and the model section's (the tiny model's values)."""
    from llmlab.model.config import ModelConfig
    from llmlab.registry import settings_lines
    return [*settings_lines(SCHEMA), "model:  # the tiny model's; a preset (model=gpt2) sets some",
            *settings_lines(ModelConfig, 2)]


def run(cfg: dict, run_dir: Path) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from llmlab.train.loop import run_training
    from llmlab.train.sweep import run_job
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        run_training(cfg, run_dir)
        return
    logger = cfg.get("logger") or {}
    if "group" in logger and not logger["group"]:
        logger["group"] = Path(hydra_cfg.sweep.dir).name  # one wandb group per sweep: curves overlay
    run_job(cfg, run_dir, hydra_cfg.job.num)
