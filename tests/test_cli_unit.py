"""Pieces of the command line that need no subprocess."""

from pathlib import Path

import pytest

from llmlab.overrides import expand_sweeps, hydra_overrides, quote_free_text, split_args


@pytest.mark.parametrize("value", ["def fib(", "it's", "x = [1, 2]", "a\\nb", "end\\", "q\\'x", "plain"])
def test_free_text_values_reach_the_config_unchanged(value):
    from hydra.core.override_parser.overrides_parser import OverridesParser
    parsed = OverridesParser.create().parse_override(quote_free_text(f"prompt={value}"))
    assert parsed.value() == value


@pytest.mark.parametrize("value", ["1e5", "0.10", "007", "12", "-3"])
def test_a_number_given_to_a_path_or_text_setting_is_kept_as_typed(value):
    from hydra.core.override_parser.overrides_parser import OverridesParser
    parser = OverridesParser.create()
    assert parser.parse_override(quote_free_text(f"out={value}", literal_keys=("out",))).value() == value
    assert quote_free_text(f"out={value}") == f"out={value}"  # other settings: Hydra's number, checked as one
    assert quote_free_text(f"out={value},1", literal_keys=("out",)) == f"out={value},1"  # a sweep stays a sweep


def test_valid_overrides_and_flags_pass_through():
    for arg in ("optim.lr=1e-3,3e-3", "model=gqa", "-m", "--cfg", "data.paths=[a.txt,b.txt]"):
        assert quote_free_text(arg) == arg


def test_split_args_skips_hydra_flags_and_keys():
    assert split_args(["-m", "--cfg", "job", "a=1", "hydra.run.dir=x", "b=2", "--info", "defaults"]) == ["a=1", "b=2"]


def test_hydra_overrides_are_picked_out_for_their_own_check():
    args = ["-m", "--cfg", "job", "a=1", "hydra.run.dir=x", "hydra/launcher=joblib", "+hydra.x=1",
            "hydra.launcher.n_jobs=2,4", "--info", "defaults", "hydra.verbose=true"]
    assert hydra_overrides(args) == ["hydra.run.dir=x", "hydra/launcher=joblib", "+hydra.x=1", "hydra.verbose=true"]


def test_sweep_dir_names_are_short_and_path_safe():
    from llmlab.names import path_slug
    assert path_slug("model/attention=mla,seed=1") == "model-attention=mla,seed=1"
    assert path_slug("data.paths=[/tmp/a b/*.txt],optim.lr=0.001") == "data.paths=-tmp-a-b-.txt-,optim.lr=0.001"
    from llmlab.overrides import name_sweep_runs_by_swept_keys
    args = ["-m", "optim.lr=1e-3,3e-3", "model/attention=mha", "data.paths=[a.txt]"]
    assert name_sweep_runs_by_swept_keys(args)[1] == \
        "hydra.job.config.override_dirname.exclude_keys=[data.paths,model/attention]"
    assert name_sweep_runs_by_swept_keys(["optim.lr=1"]) == ["optim.lr=1"]  # not a sweep
    assert len(path_slug("x=" + "y" * 500)) <= 120
    # an IsoFLOP sweep's four axes all stay in the name
    assert path_slug("model.d_model=256,model/attention=mla,seed=1,train.max_flops=10000000000000.0") == \
        "model.d_model=256,model-attention=mla,seed=1,train.max_flops=1e13"
    assert path_slug("") == "defaults"
    # a budget keeps its value within the limit: 1e8, not the first digits of 100000000.0
    assert path_slug("model.d_model=16,model/attention=mha,train.max_flops=100000000.0") == \
        "model.d_model=16,model-attention=mha,train.max_flops=1e8"
    assert path_slug("train.max_flops=250000000,train.steps=20000,x=1.0") == "train.max_flops=2.5e8,train.steps=20000,x=1"


def test_sweeps_expand_to_every_combination():
    combos = expand_sweeps(["a=1,2", "b=x,y", "c=3"])
    assert combos == [["a=1", "b=x", "c=3"], ["a=1", "b=y", "c=3"], ["a=2", "b=x", "c=3"], ["a=2", "b=y", "c=3"]]


def test_ckpt_latest_finds_the_newest_checkpoint(tmp_path, monkeypatch):
    import os
    import time

    from llmlab.errors import UserError
    from llmlab.train.checkpoint import load_checkpoint, latest_run_checkpoint
    from llmlab.train.recovery import REQUIRED
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="no checkpoints under"):
        load_checkpoint("latest")
    for i, run in enumerate(["outputs/train/a", "outputs/train-sweep/b/0"]):
        ckpt = tmp_path / run / "checkpoints" / "step_000010"
        ckpt.mkdir(parents=True)
        for name in REQUIRED:  # complete, as far as listing goes
            (ckpt / name).write_bytes(b"x")
        os.utime(ckpt / "model.safetensors", (time.time() + i, time.time() + i))
    # complete as far as listing goes: which one `ckpt=latest` names, before it is loaded
    assert latest_run_checkpoint(Path("outputs")) == tmp_path / "outputs/train-sweep/b/0/checkpoints/step_000010"


def test_added_overrides_join_the_users_so_flags_after_them_still_parse():
    from llmlab.overrides import add_overrides
    args = ["-m", "seed=0,1", "--cfg", "job"]
    assert add_overrides(args, ["hydra.x=1"]) == ["-m", "hydra.x=1", "seed=0,1", "--cfg", "job"]
    assert add_overrides(["-m"], ["hydra.x=1"]) == ["-m", "hydra.x=1"]
    assert add_overrides(["--cfg", "job", "a=1"], ["b=2"]) == ["--cfg", "job", "b=2", "a=1"]


def test_a_glob_sweep_is_expanded_over_the_groups_options():
    """``glob(...)`` over a config group's options is expanded where the options are known, so
    its jobs are checked before any runs; without them it is left to Hydra, as before."""
    options = {"model/attention": ["gqa", "mha", "mla", "mqa"]}.get
    combos = expand_sweeps(["model/attention=glob(m*,exclude=mqa)", "seed=0,1"], lambda g: options(g, []))
    assert combos == [["model/attention=mha", "seed=0"], ["model/attention=mha", "seed=1"],
                      ["model/attention=mla", "seed=0"], ["model/attention=mla", "seed=1"]]
    assert expand_sweeps(["model/attention=glob(m*)", "seed=0,1"]) == [["seed=0"], ["seed=1"]]
