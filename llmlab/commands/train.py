"""llmlab train: token shards -> model checkpoints, metrics, logs. Under -m, each job is one
run of the sweep (llmlab.train.sweep)."""

from pathlib import Path

from llmlab.commands import Command
from llmlab.train.settings import GROUPS, TrainConfig, TrainJob, check_train_config


def help_settings() -> list[str]:
    """The run's own settings, and the model section's (the tiny model's values)."""
    from llmlab.model.config import ModelConfig
    from llmlab.registry import settings_lines
    return [*settings_lines(TrainConfig), "model:  # the tiny model's; a preset (model=gpt2) sets some",
            *settings_lines(ModelConfig, 2)]


def run(job: TrainJob, run_dir: Path) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from llmlab.train.loggers import LOGGER
    from llmlab.train.loop import run_training
    from llmlab.train.sweep import run_job
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        run_training(job, run_dir)
        return
    if LOGGER.get(job.logger.kind).groups_runs and not job.logger.group:
        job = job.with_logger_group(Path(hydra_cfg.sweep.dir).name)  # one wandb group per sweep: curves overlay
    run_job(job, run_dir, hydra_cfg.job.num)


def check_init_overrides(job: TrainJob, overrides: list[str]) -> None:
    """``init=``: a setting of the network or tokenizer that contradicts the source is one line."""
    if job.init is not None:
        from llmlab.train.init import check_overrides
        check_overrides(overrides, job.composed, job.init)


COMMAND = Command("train", TrainConfig, run, resolve=check_train_config, help_lines=help_settings,
                  check_overrides=check_init_overrides, groups=GROUPS)
SCHEMA = COMMAND.schema
