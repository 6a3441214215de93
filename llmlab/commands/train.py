"""llmlab train: token shards -> model checkpoints, metrics, logs."""

from pathlib import Path


def validate(cfg: dict) -> None:
    from llmlab.train.settings import check_train_config
    check_train_config(cfg)


def run(cfg: dict, run_dir: Path) -> None:
    from llmlab.train.loop import run_training
    run_training(cfg, run_dir)
