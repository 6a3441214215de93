"""A new kind of part is one file: its class and its nested Config, in its family's package,
found by the registry with no other edit. Four kinds were added that way (a position that
biases scores, an optimizer, an FFN and a block); these tests hold them to it, and check that
they compose from the command line's spelling like any other option."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import llmlab
from llmlab.cli import register_parts
from llmlab.model.config import BLOCK, FFN, POSITION
from llmlab.paths import conf_dir
from llmlab.train.optim_config import OPTIMIZER
from llmlab.train.settings import check_train_config

ONE_FILE = [(POSITION, "alibi"), (OPTIMIZER, "radam"), (FFN, "swish_mlp"), (BLOCK, "layerscale")]
SOURCES = [p for root in (Path(llmlab.__file__).parent, conf_dir()) for p in root.rglob("*")
           if p.suffix in (".py", ".yaml")]


@pytest.mark.parametrize("registry, name", ONE_FILE, ids=[n for _, n in ONE_FILE])
def test_a_kind_is_one_class_with_its_config_in_one_file_that_nothing_else_names(registry, name):
    cls = registry.get(name)
    path = Path(inspect.getsourcefile(cls))
    assert cls.Config.__qualname__ == f"{cls.__name__}.Config"  # nested in the class
    assert Path(inspect.getsourcefile(cls.Config)) == path
    package = Path(importlib.import_module(registry.impl).__file__).parent
    assert path.parent == package, f"{path} is not in {package}, where the registry looks"
    naming = [str(p) for p in SOURCES if p != path and re.search(rf"\b{name}\b", p.read_text())]
    assert not naming, f"files other than {path.name} name '{name}': {naming}"


def test_the_four_compose_from_the_command_line_spelling():
    register_parts("train")
    overrides = ["pos=alibi", "optim=radam", "model/ffn=swish_mlp", "norm=layerscale", "norm.init=0.01",
                 "pos.exponent=4"]
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        cfg = OmegaConf.to_container(compose("train", overrides=overrides), resolve=True)
    job = check_train_config(cfg)
    assert (job.spec.pos.kind, job.optim.kind, job.spec.ffn.kind, job.spec.norm.placement) == \
        ("alibi", "radam", "swish_mlp", "layerscale")
    assert job.spec.norm.init == 0.01 and job.spec.pos.exponent == 4
    assert job.optim.beta2 == 0.999  # the nested Config's defaults


@pytest.mark.parametrize("group, override, message", [
    ("norm=layerscale", "norm.init=0", "norm.init: must be in (0, 1], got 0.0"),
    # a float32 overflow at build time, a traceback, before the range had an upper end
    ("norm=layerscale", "norm.init=1e40", "norm.init: must be in (0, 1], got 1e+40"),
    ("pos=alibi", "pos.exponent=-1", "pos.exponent: must be > 0, got -1.0"),
    ("optim=radam", "optim.beta2=1", "optim.beta2: must be in [0, 1), got 1.0"),
    # these three went to torch (a traceback) or trained with a setting that undoes the method
    ("optim=muon", "optim.momentum=-1", "optim.momentum: must be in [0, 1), got -1.0"),
    ("optim=muon", "optim.momentum=1", "optim.momentum: must be in [0, 1), got 1.0"),
    ("optim=adafactor", "optim.beta2_decay=0.5", "optim.beta2_decay: must be <= 0, got 0.5"),
    ("model.mtp_heads=1", "model.mtp_weight=-1", "model.mtp_weight: must be >= 0, got -1.0"),
    # past float32, an lr overflowed in Lion's, SGD's and Muon's first step (a traceback)
    ("optim=lion", "optim.lr=1e40", "optim.lr: 1e+40 is out of range; a number setting is at most 3.4e+38 in size "
                                    "(float32's largest)"),
])
def test_their_declared_ranges_are_checked(group, override, message):
    from llmlab.errors import ConfigError

    register_parts("train")
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        cfg = OmegaConf.to_container(compose("train", overrides=[group, override]), resolve=True)
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        check_train_config(cfg)


def test_cfg_job_finds_a_one_file_kind_and_lists_it_when_an_option_is_wrong(tmp_path):
    """``--cfg job`` composes without importing the one-file kinds (no torch) until the config
    names one; then it loads them and composes again. A fresh process, so nothing is loaded."""
    from tests.conftest import run_cli

    shown = run_cli("train", "--cfg", "job", "pos=alibi", "pos.exponent=4", cwd=tmp_path, process=True)
    assert shown.returncode == 0, shown.stderr
    assert "kind: alibi\n  exponent: 4.0" in shown.stdout
    wrong = run_cli("train", "--cfg", "job", "pos=alibx", cwd=tmp_path, process=True)
    assert wrong.returncode == 2
    assert wrong.stderr.strip() == ("llmlab: error: pos=alibx: unknown option; allowed: "
                                    f"{', '.join(POSITION.names())}")
    # what registering a kind stores besides its own option: model=mla, the tiny model with mla
    shown = run_cli("train", "--cfg", "job", "model=mla", cwd=tmp_path, process=True)
    assert shown.returncode == 0 and "attention:\n  kind: mla\n" in shown.stdout, shown.stderr
    wrong = run_cli("train", "model=mlx", cwd=tmp_path, process=True)
    assert wrong.returncode == 2 and "mla" in wrong.stderr.strip().rpartition("allowed: ")[2].split(", "), wrong.stderr


def test_only_the_default_configs_kinds_declare_their_config_apart_from_their_class():
    """Every kind nests its Config in its class, except those the default ``llmlab train``
    config is made of (and the kinds their Configs extend), declared in modules without torch
    so that composing and checking the default config imports none."""
    from llmlab.model.config import ATTENTION, BLOCK, FFN, NORM, OBJECTIVE
    from llmlab.train.optim_config import OPTIMIZER
    from tests.helpers import composed

    cfg = composed()
    picked = {(ATTENTION, cfg["attention"]["kind"]), (FFN, cfg["ffn"]["kind"]), (NORM, cfg["norm"]["kind"]),
              (BLOCK, cfg["norm"]["placement"]), (POSITION, cfg["pos"]["kind"]),
              (OBJECTIVE, cfg["objective"]["kind"]), (OPTIMIZER, cfg["optim"]["kind"])}
    allowed = set()
    for registry, name in picked:
        for base in registry.config_of(name).__mro__:
            allowed |= {(registry.family, kind) for kind, config in registry.items() if registry.config_of(kind) is base}
    apart = {(registry.family, kind) for registry in (ATTENTION, FFN, NORM, BLOCK, POSITION, OBJECTIVE, OPTIMIZER)
             for kind, _ in registry.items() if "." not in registry.config_of(kind).__qualname__}
    assert apart == allowed and len(allowed) == 8


def test_settings_are_checked_before_the_one_file_kinds_load_and_with_them_where_named(tmp_path):
    """A fresh process checks the settings before it imports the kinds written as one file
    (torch with them: 3 to 4 s), so a mistake is one line within about a second. A config that
    names such a kind has it loaded and is checked again with it, so its settings are judged
    by its own schema."""
    from tests.conftest import REPO

    code = ("import sys\nfrom llmlab.cli import main\ntry:\n    main(sys.argv[1:])\n"
            "except SystemExit as e:\n    print(e.code, 'torch' in sys.modules)\n")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code, *args], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120, env={**os.environ, "PYTHONPATH": str(REPO), "LLMLAB_CACHE": str(tmp_path)})

    typo = run("train", "train.steps=x")
    assert (typo.stdout, typo.stderr) == ("2 False\n", "llmlab: error: train.steps: expected an integer, got 'x'\n")
    # the other commands that load a model check their settings before torch too
    for args, line in ((("sample", "top_p=0"), "top_p: must be in (0, 1], got 0.0"),
                       (("sample", "pack_weights=maybe"), "pack_weights: must be one of auto, true, false; got 'maybe'"),
                       (("eval", "analysis=attention", "analysis.windows=0"), "analysis.windows: must be >= 1, got 0"),
                       (("export", "format=onnx"), "format: unknown 'onnx'; allowed: hf")):
        r = run(*args)
        assert (r.stdout, r.stderr) == ("2 False\n", f"llmlab: error: {line}\n"), args
    # and a checkpoint path that does not exist is found missing before torch too (status 1: a
    # problem found while running, as a damaged checkpoint is)
    for args, line in ((("eval", "ckpt=nope"), "ckpt: nope does not exist"),
                       (("export", "ckpt=nope"), "ckpt: nope does not exist"),
                       (("sample", f"ckpt={tmp_path}", "draft=nope"), "draft: nope does not exist")):
        r = run(*args)
        assert (r.stdout, r.stderr) == ("1 False\n", f"llmlab: error: {line}\n"), args
    named = run("train", "pos=alibi", "pos.exponent=x")
    assert (named.stdout, named.stderr) == ("2 True\n", "llmlab: error: pos.exponent: expected a number, got 'x'\n")
