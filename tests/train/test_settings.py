"""The typed train job: resolved once from the composed config, frozen, with every derived
value computed there and the settings kept as the user wrote them."""

from __future__ import annotations

import dataclasses

import pytest

from llmlab.train.loggers import LOGGER
from llmlab.train.settings import check_train_config
from tests.helpers import job_of


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


# Run ids measured before sched.warmup could be null, widths could be relative, muP existed,
# Muon's iterations could run in fp32, qknorm's eps was a setting and the default recipe
# changed (Muon, qknorm, 400 steps; then d_model 96 for 750 steps): runs of these settings keep
# their ids (and resume) across the change. The default recipe before: optim=adamw,
# train.steps=1000, model/attention=mha, at d_model 192.
BEFORE = ("optim=adamw", "train.steps=1000", "model.d_model=192")
OLD_RUN_IDS = {("model/attention=mha", *BEFORE): "83b82b337a8d", ("model=mla", *BEFORE): "4a6dd166b726",
               ("model=swa", *BEFORE): "73814f12e173", ("model=gqa", "attention.kv_heads=2", *BEFORE): "167838239fb6",
               ("sched=wsd", "model/attention=mha", *BEFORE): "923a2a17d397",
               ("sched.warmup=10", "model/attention=mha", *BEFORE): "9da8e2deefce",
               ("model/ffn=moe", "model/attention=mha", *BEFORE): "838e6c87021e", ("model=gpt2", *BEFORE): "4fdfad3171d3",
               # Muon's lr and adamw_lr as they were before their defaults changed (0.02 and 3e-3)
               ("optim=muon", "optim.ns_precision=bf16", "optim.lr=0.02", "optim.adamw_lr=3e-3", "model/attention=mha",
                "train.steps=1000", "model.d_model=192"): "d3d02c0c594f",
               # the q/k norms' eps before it followed norm.eps
               ("model=qknorm", "attention.eps=1e-6", *BEFORE): "54b456c7d68a",
               # the default run of Muon and qknorm at d_model 192, 400 steps
               ("model.d_model=192", "train.steps=400"): "678f32c7e273"}


@pytest.mark.parametrize("overrides", OLD_RUN_IDS)
def test_settings_written_before_keep_their_run_ids(overrides):
    assert job_of(*overrides)[0].run_id == OLD_RUN_IDS[overrides]


def test_a_budget_run_with_an_unset_warmup_gets_a_new_id_since_it_trains_differently():
    assert job_of("train.max_flops=1e12")[0].run_id != "69ea3ea94f23"  # its id when the warm-up was 50 steps
    # asking for 50 steps keeps it (with the recipe of then: its steps never counted in a budget run)
    assert job_of("train.max_flops=1e12", "sched.warmup=50", "model/attention=mha", "optim=adamw",
                  "model.d_model=192")[0].run_id == "69ea3ea94f23"
    # and the recipe of Muon and qknorm at d 192, whose default steps were 400: a budget run's id
    # keeps the steps of before (1000) whatever the default steps are now
    assert job_of("train.max_flops=1e12", "sched.warmup=50", "model.d_model=192")[0].run_id == "a6c1bdb01942"


def test_widths_relative_to_the_model_resolve_as_documented():
    job, cfg = job_of("model=mla", "model.d_model=128", "attention.kv_rank=d_model/2", "attention.rope_dim=0.125*d_model",
                      "attention.nope_dim=d_model*0.25", "model/ffn=gelu", "ffn.hidden=3*d_model")
    a = job.spec.attention
    assert (a.kv_rank, a.rope_dim, a.nope_dim, a.v_dim) == (64, 16, 32, 64) and job.spec.ffn.hidden == 384
    assert cfg["attention"]["kv_rank"] == "d_model/2"  # the settings as written: the run id follows them
    wide, _ = job_of("model=mla", "model.d_model=256", "attention.kv_rank=d_model/2")
    assert wide.spec.attention.kv_rank == 128  # the same design at another width
    swa, _ = job_of("model=swa", "model.max_seq_len=256", "attention.window=max_seq_len/4")
    assert swa.spec.attention.window == 64
    assert job_of("model=mla", "model.d_model=192", "attention.kv_rank=96")[0].spec.attention.kv_rank == 96
    assert job_of("model/ffn=gelu", "ffn.hidden=null")[0].spec.ffn.hidden is None  # a null default takes null


def test_a_depth_relative_to_the_width_keeps_the_aspect_ratio_and_an_integer_keeps_its_id():
    for d, layers in ((64, 2), (96, 3), (160, 5), (176, 6)):  # 176 / 32 = 5.5 rounds to 6
        job, cfg = job_of(f"model.d_model={d}", "model.n_layers=d_model/32")
        assert job.spec.model.n_layers == layers and cfg["model"]["n_layers"] == "d_model/32"
    assert job_of("model.n_layers=4")[0].run_id == job_of()[0].run_id  # the default depth, written out
    assert job_of("model.n_layers=4", "model/attention=mha", *BEFORE)[0].run_id == "83b82b337a8d"


@pytest.mark.parametrize("setting, message", [
    ("model.n_layers=d_model/1000", r"^model.n_layers: must be >= 1, got 0$"),
    ("model.n_layers=max_seq_len/2", r"^model.n_layers: expected an integer or a width relative to model.d_model such as d_model/4"),
    ("model.n_layers=2.5", r"^model.n_layers: expected an integer or a width relative to model.d_model"),
    ("model.n_layers=null", r"^model.n_layers: expected an integer or a width relative to model.d_model .*got None$"),
    ("model.n_heads=7", r"^model.n_heads: 7 does not divide model.d_model=96$"),  # the other settings are named first
])
def test_a_bad_depth_names_its_key(setting, message):
    from llmlab.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        job_of("model.n_layers=d_model/32", setting) if "n_heads" in setting else job_of(setting)


@pytest.mark.parametrize("setting, message", [
    ("attention.kv_rank=d_modl/2", r"^attention.kv_rank: expected an integer or a width relative to model.d_model such as d_model/4"),
    ("attention.kv_rank=d_model/0", r"^attention.kv_rank: expected a number in 'd_model/0'"),
    ("attention.kv_rank=2.5", r"^attention.kv_rank: expected an integer or a width relative to model.d_model"),
    ("attention.kv_rank=d_model/1000", r"^attention.kv_rank: must be >= 1, got 0"),
    ("attention.kv_rank=null", r"^attention.kv_rank: expected an integer or a width relative to model.d_model .*got None$"),
    ("attention.rope_dim=d_model/12", r"^attention.rope_dim: must be even"),  # 192 / 12 = 16 is even; 256 / 12 is not
])
def test_a_bad_relative_width_names_its_key(setting, message):
    from llmlab.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        job_of("model=mla", "model.d_model=256" if "rope" in setting else "model.d_model=192", setting)


def test_mup_is_refused_with_an_optimizer_it_has_no_rule_for():
    from llmlab.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^model.parametrization: mup .* optim=sgd; allowed with mup: adamw, lion, radam$"):
        job_of("model.parametrization=mup", "model.tie_embeddings=false", "optim=sgd")


@pytest.mark.parametrize("overrides, message", [
    (("optim=muon", "precision=fp16"), r"^precision: fp16 loss scaling needs a single optimizer; optim=muon has several"),
    (("optim=adamw", "train.head_loss=fused", "precision=fp16"), r"^train.head_loss: fused computes the logits' gradients"),
])
def test_what_fp16_asks_of_the_optimizer_and_the_head_is_checked_with_the_settings(overrides, message):
    from llmlab.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        job_of(*overrides)
    job_of("optim=adamw", "precision=fp16")  # one optimizer: fine


def test_fsdp_with_an_optimizer_of_several_is_refused_where_there_is_something_to_shard(monkeypatch):
    from llmlab.errors import ConfigError

    job_of("optim=muon", "train.fsdp=true")  # one process: nothing is sharded
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"^train.fsdp: optim=muon is not supported with FSDP"):
        job_of("optim=muon", "train.fsdp=true")


def test_a_negative_init_std_is_one_line_not_torchs_error_at_the_first_weight():
    from llmlab.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^model.init_std: must be >= 0, got -1.0$"):
        job_of("model.init_std=-1")
