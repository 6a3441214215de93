"""llmlab train: token shards -> model checkpoints, metrics, logs."""

from pathlib import Path


def validate(cfg: dict) -> None:
    from llmlab.train.settings import check_train_config
    check_train_config(cfg)


def run(cfg: dict, run_dir: Path) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from llmlab.train.loop import run_training
    hydra_cfg = HydraConfig.get()
    logger = cfg.get("logger") or {}
    if hydra_cfg.mode == RunMode.MULTIRUN and "group" in logger and not logger["group"]:
        logger["group"] = Path(hydra_cfg.sweep.dir).name  # one wandb group per sweep: curves overlay
    run_training(cfg, run_dir)
