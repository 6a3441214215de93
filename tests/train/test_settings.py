"""The typed train job: resolved once from the composed config, frozen, with every derived
value computed there and the settings kept as the user wrote them."""

from __future__ import annotations

import dataclasses

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from llmlab.cli import register_parts
from llmlab.paths import conf_dir
from llmlab.train.loggers import LOGGER
from llmlab.train.settings import check_train_config


def job_of(*overrides: str):
    register_parts("train")
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        cfg = OmegaConf.to_container(compose("train", overrides=list(overrides)), resolve=True)
    return check_train_config(cfg), cfg


def test_derived_values_are_computed_once_and_the_settings_stay_as_written():
    job, cfg = job_of("train.max_flops=1e12*3", "train.batch_tokens=4096", "train.batch_size=4",
                      "model.max_seq_len=256", "tokenizer.vocab_size=1024")
    assert job.max_flops == 3e12 and job.loop.max_flops == "1e12*3"
    assert job.grad_accum == 4 and job.loop.grad_accum == 1  # 4096 / (4 x 256); the setting is untouched
    assert job.spec.vocab_size == 1024  # the tokenizer's planned vocabulary stands in until the data is ready
    assert job.config == cfg and job.run_id == check_train_config(cfg).run_id
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.grad_accum = 2


def test_a_sweep_groups_its_runs_only_with_a_logger_that_groups():
    job, _ = job_of("logger=wandb")
    grouped = job.with_logger_group("sweep-1")
    assert grouped.logger.group == "sweep-1" and grouped.config["logger"]["group"] == "sweep-1"
    assert job.logger.group is None and job.config["logger"]["group"] is None  # a new job; this one is frozen
    assert LOGGER.get("wandb").groups_runs and not LOGGER.get("none").groups_runs
