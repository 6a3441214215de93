"""The command line as a user meets it, through subprocesses: usage, bad input, and one
whole tokenize -> train -> sample -> eval run on a small corpus."""

import json
import shutil
from pathlib import Path

import pytest
import yaml
import torch

from llmlab.model.attention import ATTENTION
from llmlab.model.packing import packing_supported
from tests.conftest import check_cli, run_cli
from tests.helpers import TINY, one_line_error, train_a_tiny_run


def test_no_command_lists_the_commands(tmp_path):
    r = run_cli(process=True, cwd=tmp_path)
    assert r.returncode == 0
    for name in ("tokenize", "train", "eval", "sample"):
        assert f"  {name} " in r.stdout
    assert run_cli("--help", process=True, cwd=tmp_path).stdout == r.stdout


# Holds a command's end: a thread still running, an exit handler, buffered output, and an object
# whose __del__ runs only when the interpreter is finalized (a cycle kept by a module global)
EXIT_PROBE = """
import atexit, sys, threading, time
MARK = sys.argv[1]
class Witness:
    def __del__(self, open=open, mark=MARK):
        open(mark, "a").write("finalized ")
kept = Witness()
kept.cycle = kept
atexit.register(lambda: open(MARK, "a").write("handler "))
threading.Thread(target=lambda: (time.sleep(0.3), open(MARK, "a").write("thread "))).start()
sys.stdout.write("buffered, ")
from llmlab.cli import main, run
entry = run if sys.argv[2] == "run" else main
sys.argv = ["llmlab", *sys.argv[3:]]
entry()
"""


@pytest.mark.parametrize("entry, args, status", [("run", ["--version"], 0), ("run", ["train", "train.steps=x"], 2),
                                                 ("main", ["--version"], 0)])
def test_a_command_ends_as_a_normal_exit_would_without_finalizing(tmp_path, entry, args, status):
    """`llmlab` and `python -m llmlab` (`llmlab.cli.run`) end like a normal exit: running
    threads are joined, the exit handlers run, buffered output arrives, the status is the
    command's. Then the process ends without finalizing the interpreter, where tearing down
    torch's modules took seconds; `main` alone, as tests and notebooks call it, leaves the
    process to end as it will (its objects are finalized)."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO
    mark = tmp_path / "mark"
    r = subprocess.run([sys.executable, "-c", EXIT_PROBE, str(mark), entry, *args], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=tmp_path)
    assert r.returncode == status, r.stderr
    assert r.stdout.startswith("buffered, ") and (status or r.stdout.startswith("buffered, llmlab "))
    assert mark.read_text() == "thread handler " + ("finalized " if entry == "main" else "")
    if status:
        assert r.stderr == "llmlab: error: train.steps: expected an integer, got 'x'\n"


# An executor never shut down (as joblib's, under hydra/launcher=joblib): its thread ends only
# when the interpreter's own exit tells it to
POOL_PROBE = """
import sys
from concurrent.futures import ThreadPoolExecutor
import llmlab.cli
llmlab.cli.EXIT_WAIT_S = 0.5
pool = ThreadPoolExecutor(1)
pool.submit(print, "job ran").result()
sys.argv = ["llmlab", *sys.argv[1:]]
llmlab.cli.run()
"""


@pytest.mark.parametrize("args, status", [(["--version"], 0), (["train", "train.steps=x"], 2)])
def test_a_thread_that_ends_only_at_the_interpreters_exit_does_not_hold_the_command(tmp_path, args, status):
    """`run` waits a moment for the other threads; one still running then is left to the
    interpreter's ordinary exit, which ends it, instead of being waited for forever."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO
    r = subprocess.run([sys.executable, "-c", POOL_PROBE, *args], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=tmp_path)
    assert r.returncode == status, r.stderr
    assert r.stdout.startswith("job ran\n") and (status or "llmlab " in r.stdout)


def test_unknown_command_prints_usage_and_exits_2(tmp_path):
    r = run_cli("trian", process=True, cwd=tmp_path)
    assert r.returncode == 2
    assert "unknown command 'trian'" in r.stderr and "usage: llmlab" in r.stderr and "Traceback" not in r.stderr


def test_each_commands_help_lists_its_own_groups_and_settings_with_their_comments(tmp_path):
    r = run_cli("train", "--help", process=True, cwd=tmp_path)
    assert r.returncode == 0
    assert "llmlab train" in r.stdout and f"model/attention: {', '.join(ATTENTION.names())}" in r.stdout
    assert "  adamw          AdamW (Loshchilov & Hutter 2019)" in r.stdout  # an option's own description
    assert "lr=0.003, beta1=0.9" in r.stdout  # and its settings with their defaults
    assert "model/ffn: deepseek, geglu, gelu, gelu_tanh" in r.stdout and "  pre_layernorm  Pre-norm with LayerNorm" in r.stdout
    assert "  log_every: 10" in r.stdout and "batch_tokens: null  # tokens per optimizer step" in r.stdout
    for command, own, foreign in (("eval", "data: hf, pysource, text", "optim:"), ("sample", "temperature", "model:"),
                                  ("report", "baseline", "data:"), ("export", "ckpt", "optim:"),
                                  ("tokenize", "tokenizer: bpe, byte, pretrained", "model:")):
        r = check_cli(command, "--help", cwd=tmp_path)  # the train case above came through a shell
        assert r.returncode == 0 and f"llmlab {command}" in r.stdout and own in r.stdout, command
        assert foreign not in r.stdout and "hydra:" not in r.stdout, command


def test_help_lists_the_options_of_ones_own_config_dir(tmp_path):
    """``--config-dir DIR`` adds DIR's options to a group, as Hydra composes them: help lists
    them with their first comment; an option llmlab ships keeps its own line (Hydra picks it)."""
    mine = tmp_path / "mine" / "model"
    mine.mkdir(parents=True)
    (mine / "wide.yaml").write_text("# A wider llama of my own.\ndefaults:\n  - llama\n  - _self_\nd_model: 96\n")
    (mine / "gpt2.yaml").write_text("# Not the one Hydra picks.\ndefaults:\n  - tiny\n  - _self_\nd_model: 40\n")
    for flag in (["--config-dir", str(tmp_path / "mine")], [f"-cd={tmp_path / 'mine'}"]):
        r = check_cli("train", *flag, "--help", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        listed = next(line for line in r.stdout.splitlines() if line.startswith("model: "))
        assert "wide" in listed.split(": ", 1)[1].split(", ") and "  wide           A wider llama of my own." in r.stdout
        assert "  gpt2           GPT-2's recipe" in r.stdout and "Not the one" not in r.stdout
    r = run_cli("train", "--config-dir", str(tmp_path / "mine"), "model=wide", "--cfg", "job", cwd=tmp_path)
    assert r.returncode == 0 and "d_model: 96" in r.stdout, r.stderr
    assert "wide" not in check_cli("train", "--help", cwd=tmp_path).stdout


def test_cfg_job_shows_the_composed_config(tmp_path):
    r = run_cli("train", "model=gqa", "attention.kv_heads=2", "--cfg", "job", process=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "kind: gqa" in r.stdout and "kv_heads: 2" in r.stdout and "name: gqa" in r.stdout


@pytest.mark.parametrize("args, fragment", [
    (["model.d_model=abc"], "model.d_model: expected an integer, got 'abc'"),
    (["model/ffn=swish"], "model/ffn=swish: unknown option; allowed: "),
    (["hydra.callbacks.report.baselin=1"], "allowed under 'hydra.callbacks.report': _target_, baseline"),
])
def test_cfg_job_composes_once_and_its_mistakes_are_one_line(tmp_path, args, fragment):
    """--cfg only shows a config, so Hydra composes it alone (no check composes it first);
    what its composition rejects is still one line."""
    one_line_error(run_cli("train", *args, "--cfg", "job", cwd=tmp_path), 2, fragment)


@pytest.mark.parametrize("args, fragments", [
    (["train", "attention.kv_head=2"], ["attention.kv_head: unknown key"]),
    (["train", "model=gqa", "attention.kv_head=2"], ["attention.kv_head: unknown key", "kind, kv_heads"]),
    (["train", "model/attention=perceiver"], ["model/attention=perceiver: unknown option", ", ".join(ATTENTION.names())]),
    (["train", "model=gqa", "attention.kv_heads=3"], ["attention.kv_heads: 3 does not divide model.n_heads=4"]),
    (["train", "norm.kind=batchnorm"], ["norm.kind: unknown norm.kind 'batchnorm'", "layernorm, rmsnorm"]),
    (["train", "-m", "optim.lr=1e-3,-2"], ["optim.lr: must be > 0"]),
    (["train", "distill.data=gen"], ["distill.data: unknown 'gen'", "corpus, teacher"]),
    (["train", "train.head_loss=chunked"], ["train.head_loss: unknown 'chunked'", "auto, fused, plain"]),
    (["train", "train.max_flops=0"], ["train.max_flops: must be > 0, got 0"]),
    (["train", "train.max_flops=1e15*x"], ["train.max_flops: must be a number of FLOPs such as 6e15 or 1e15*6"]),
    (["train", "train.max_flops=6e15", "train.max_tokens=1000"],
     ["train.max_flops: set either max_flops or max_tokens", "max_flops=6e+15, max_tokens=1000"]),
    # the budget set the run's length and steps= was passed over; batch_tokens set the accumulation over grad_accum=
    (["train", "train.steps=500", "train.max_flops=6e15"],
     ["train.steps: set either steps or a budget (max_flops, max_tokens), not both: steps=500, max_flops=6e+15"]),
    (["train", "train.grad_accum=2", "train.batch_tokens=4096"],
     ["train.grad_accum: set either grad_accum or batch_tokens (which sets it), not both"]),
    (["eval", "ckpt=x", "text=a.txt", "data=text"], ["text: give text= or data=, not both"]),
    (["eval", "ckpt=x", "text=a.txt", "split=train"], ["split: text= is scored whole"]),
    (["report", "runs", "select=best"], ["select: unknown 'best'", "all, best_lr"]),
    (["report", "runs", "surface=power"], ["surface: unknown 'power'", "chinchilla, kaplan"]),
    (["train", "distill.wieght=0.5"], ["distill.wieght: unknown key", "gen_batch", "weight"]),
    (["sample", "max_new_tokens=-1"], ["max_new_tokens: must be >= 0"]),
    (["sample", "temperature=-0.5"], ["temperature: must be >= 0"]),
    (["sample", "top_p=0"], ["top_p: must be in (0, 1]"]),
    (["sample", "top_p=1.5"], ["top_p: must be in (0, 1]"]),
    (["sample", "spec.min_confidence=1.5"], ["spec.min_confidence: must be in [0, 1], got 1.5"]),
    (["sample", "pack_weights=fast"], ["pack_weights: must be one of auto, true, false; got 'fast'"]),
    (["sample", "draft=d", "spec.draft_vocab=0"], ["spec.draft_vocab: must be >= 1 or null, got 0"]),
    (["sample", "spec.draft_vocab=64"], ["spec.draft_vocab:", "pass draft=<ckpt>"]),
    # several values outside -m: Hydra's own message would end in a traceback
    (["train", "train.steps=1,2"], ["train.steps: '1,2' gives several values", "-m train.steps=1,2",
                                    "train.steps=[1,2]"]),
    (["train", "seed=range(3)", "hydra.run.dir=x"], ["seed: 'range(3)' gives several values"]),
    (["eval", "ckpt=a,b"], ["ckpt: 'a,b' gives several values", "llmlab eval -m ckpt=a,b"]),
    # a sweep of no values launched no job and said nothing; a range with step 0 was Python's traceback
    (["train", "-m", "seed=range(0,-2)"], ["seed: 'range(0,-2)' gives no values to sweep"]),
    (["train", "-m", "train.steps=range(1,3,0)"], ["train.steps: 'range(1,3,0)' is not a sweep",
                                                   "range() arg 3 must not be zero"]),
    (["train", "-m", "model/attention=glob(zz*)"], ["model/attention: 'glob(zz*)' matches none of the group's options",
                                                    "mha, mla"]),
    (["train", "-m", "seed=interval(0,1)"], ["seed: 'interval(0,1)' is an interval", "-m takes a list, range()"]),
    # a config group given a number, null or a list (Hydra raises ValueError or TypeError)
    (["train", "norm=inf"], ["norm: 'inf' is not an option of this group; allowed: ", "post, pre"]),
    (["train", "model/ffn=-1"], ["model/ffn: '-1' is not an option of this group", "swiglu"]),
    (["train", "objective=null"], ["objective: 'null' is not an option of this group; allowed: clm, mlm"]),
    # an optional group's null (its default): Hydra takes none; the line says how to drop one
    (["eval", "analysis=null"], ["analysis: 'null' is not an option of this group (it is off unless chosen; ~analysis "
                                 "drops one chosen earlier); allowed: attention"]),
    (["train", "model/attention=[mha,gqa]"], ["model/attention: '[mha,gqa]' takes one option, not a list"]),
    # the section itself set to a kind's name (a traceback): the kind is its group's option
    (["train", "attention=qknorm"], ["attention: expected its settings (a mapping), got 'qknorm'; to pick one, write "
                                     "model/attention=NAME; allowed: ", "qknorm"]),
    (["train", "ffn=relu2"], ["ffn: expected its settings (a mapping), got 'relu2'", "model/ffn=NAME"]),
    (["train", "ffn=null"], ["ffn: missing; to pick one, write model/ffn=NAME; allowed: ", "swiglu"]),
    (["train", "--cfg", "job", "pos=nan"], ["pos: 'nan' is not an option of this group", "rope"]),
    (["eval", "norm=inf"], ["norm: llmlab eval has no such config group; its groups: "]),
    # a sweep job's directory has '=' in its name: unquoted in a list, Hydra reads the list as text
    (["report", "runs=[sw/0_optim.lr=0.001]"], ["runs: expected a list, got '[sw/0_optim.lr=0.001]'; quote an "
                                                "element that holds '=': runs=['a=b',c]"]),
    # Hydra's flags: its traceback (-cd), its multi-line error (-cn, -cp), a pickle loaded (--experimental-rerun)
    (["train", "-cd", "/nonexistent-llmlab"], ["--config-dir: /nonexistent-llmlab is not a directory"]),
    (["train", "--config-name=nope"], ["--config-name: no config 'nope' (give --config-dir DIR with DIR/nope.yaml); "
                                       "llmlab train composes train.yaml"]),
    (["train", "-cp", "/tmp"], ["--config-path: llmlab's commands compose the configs they ship"]),
    (["train", "--experimental-rerun", "config.pickle"], ["--experimental-rerun: not offered; it loads a pickled job"]),
    (["sample", "--shell-completion", "install=bash"], ["--shell-completion: not offered for llmlab sample"]),
    # the tokenizers library's OverflowError (a traceback) after the corpus was read
    (["tokenize", "tokenizer.min_frequency=-1"], ["tokenizer.min_frequency: must be >= 0, got -1"]),
    # an integer past int64 overflows where it is used
    (["train", "train.grad_accum=99999999999999999999"], ["train.grad_accum: 99999999999999999999 is out of range"]),
    # numpy's generators take no negative seed (it was their ValueError, after the data was prepared)
    (["train", "seed=-1"], ["seed: must be >= 0, got -1"]),
    (["sample", "seed=-3"], ["seed: must be >= 0, got -3"]),
    (["train", "~train.steps"], ["train.steps: a setting cannot be deleted (~train.steps); give it a value"]),
    # a top-level one: Hydra deletes it and the default took its place in silence
    (["train", "~seed"], ["seed: a setting cannot be deleted (~seed); give it a value (seed=...) or leave it out"]),
    (["sample", "~top_p=0.9"], ["top_p: a setting cannot be deleted (~top_p)"]),
    (["eval", "~batch_size"], ["batch_size: a setting cannot be deleted (~batch_size)"]),
    # Hydra's own settings are checked too
    (["train", "-m", "seed=0,1", "hydra.callbacks.report.baselin=x"],
     ["hydra.callbacks.report.baselin: unknown key", "_target_, baseline"]),
    (["train", "hydra.job.chdir=maybe"], ["hydra.job.chdir: expected true or false, got 'maybe'"]),
    # null where a setting takes none: the type it takes, not OmegaConf's "is not Optional"
    (["train", "train.steps=null"], ["train.steps: expected an integer, got null"]),
    # `hydra.run.dir=$RUN` with $RUN unset: the run's files would land in the working directory
    (["train", "hydra.run.dir="], ["hydra.run.dir: empty; give a directory (hydra.run.dir=. for this one)"]),
    (["eval", "hydra.run.dir=''"], ["hydra.run.dir: empty"]),
    (["train", "-m", "seed=0,1", "hydra.sweep.subdir="], ["hydra.sweep.subdir: empty; give a directory per job"]),
    (["sample", "cuda_graph=null"], ["cuda_graph: expected true or false, got null"]),
    # a document mask with a tokenizer that has no end-of-document token: said before the data is prepared
    (["train", "data.doc_mask=true", "tokenizer=pretrained", "tokenizer.path=/nope", "tokenizer.eos=null"],
     ["data.doc_mask: tokenizer.eos=null marks no document's end"]),
    # an interpolation that resolves to the wrong type (found by the fuzzer)
    (["tokenize", "data.val_fraction=${oc.env:HOME}"], ["data.val_fraction: expected a number, got"]),
    (["train", "-m", "seed=0,1", "data.val_fraction=${oc.env:HOME}"], ["data.val_fraction: expected a number"]),
    (["sample", "cuda_graph=2"], ["cuda_graph: expected true or false, got 2"]),  # OmegaConf: true
    (["train", "train.compile=yes"], ["train.compile: expected true or false, got 'yes'"]),
    (["train", "-m", "model.tie_embeddings=true,0"], ["model.tie_embeddings: expected true or false, got 0"]),
    (["train", "-m", "seed=0,1", "hydra/launcher=parallel"], ["hydra/launcher=parallel: unknown option", "basic"]),
])
def test_config_mistakes_stop_before_any_work(tmp_path, args, fragments):
    one_line_error(check_cli(*args, cwd=tmp_path), 2, *fragments)
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("env, fragment", [
    # a ValueError traceback from int() where the rank is read, or from torch's rendezvous
    ({"WORLD_SIZE": "abc"}, "WORLD_SIZE: expected a whole number >= 0 (torchrun sets it), got 'abc'"),
    ({"LOCAL_RANK": "x"}, "LOCAL_RANK: expected a whole number >= 0 (torchrun sets it), got 'x'"),
    ({"WORLD_SIZE": "2", "RANK": "3"}, "RANK: 3 is not below WORLD_SIZE=2"),
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "", "MASTER_PORT": ""},
     "WORLD_SIZE: 2 ranks, but MASTER_ADDR and MASTER_PORT are not set; start the ranks with torchrun"),
])
def test_torchruns_variables_left_in_a_shell_are_one_line(tmp_path, env, fragment):
    one_line_error(run_cli("train", "train.steps=1", env=env, cwd=tmp_path), 2, fragment)
    assert not (tmp_path / "outputs").exists()


def test_empty_torchrun_variables_mean_one_process(monkeypatch):
    """WORLD_SIZE= (set, empty) is a plain run, as unset is: each place that reads torchrun's
    variables (int('') was a traceback there)."""
    from llmlab.mistakes import check_launch_env
    from llmlab.overrides import keep_worker_ranks_out_of_outputs
    from llmlab.train.distributed import world_from_env
    from llmlab.train.sweep import is_rank_zero

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.setenv(name, "")
    check_launch_env("train")
    world = world_from_env()
    assert (world.rank, world.local_rank, world.world_size, world.enabled) == (0, 0, 1, False)
    assert is_rank_zero() and keep_worker_ranks_out_of_outputs(["hydra.run.dir=run"]) == ["hydra.run.dir=run"]


def test_an_experiment_config_of_ones_own_composes_over_the_command(tmp_path):
    """-cd DIR -cn NAME: DIR/NAME.yaml builds on the command's config (Hydra's experiment
    pattern), and the command line still wins."""
    (tmp_path / "exps").mkdir()
    (tmp_path / "exps" / "small.yaml").write_text("defaults:\n  - train\n  - _self_\ntrain:\n  steps: 3\n"
                                                    "model:\n  d_model: 64\n")
    r = run_cli("train", "-cd", "exps", "-cn", "small", "model.d_model=96", "--cfg", "job", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    cfg = yaml.safe_load(r.stdout)
    assert cfg["train"]["steps"] == 3 and cfg["model"]["d_model"] == 96 and cfg["optim"]["kind"] == "muon"
    # a mistake in one's own file: Hydra's ConfigCompositionException and PyYAML's ParserError were tracebacks
    (tmp_path / "exps" / "typo.yaml").write_text("defaults:\n  - train\n  - _self_\ntrain:\n  stepz: 3\n")
    one_line_error(run_cli("train", "-cd", "exps", "-cn", "typo", "logger=none", cwd=tmp_path), 2,
                   "train.stepz: unknown key; allowed keys: ", "batch_size", "steps")
    (tmp_path / "exps" / "cut.yaml").write_text("defaults: [train, _self_]\ntrain: {steps: [1\n")
    one_line_error(run_cli("train", "-cd", "exps", "-cn", "cut", "logger=none", cwd=tmp_path), 2,
                   "cut.yaml, line 3, column 1: not valid YAML (expected ',' or ']'")
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("args, fragment", [
    (["train", "model=gqa", "attention.kv_head=2"], "attention.kv_head: unknown key; allowed keys: kind, kv_heads"),
    # a second command's process in the slow tier: `llmlab sample` runs as a process below
    pytest.param(["sample", "top_p=0"], "top_p: must be in (0, 1]", marks=pytest.mark.slow),
])
def test_a_config_mistake_from_the_shell_is_one_line(tmp_path, args, fragment):
    """The cases above run in-process; from a shell the same mistake is the same line."""
    one_line_error(run_cli(*args, process=True, cwd=tmp_path), 2, fragment)
    assert not (tmp_path / "outputs").exists()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, which takes no new directories")
@pytest.mark.parametrize("args", [["train", "hydra.run.dir=/proc/llmlab-run"],
                                  ["train", "-m", "seed=0,1", "hydra.sweep.dir=/proc/llmlab-sweep"]])
def test_a_run_directory_the_file_system_refuses_is_one_line(tmp_path, args):
    """/proc answers mkdir with "no such file": where Hydra makes the run directory, that is
    one line naming it, not a traceback."""
    one_line_error(run_cli(*args, "train.steps=1", "logger=none", cwd=tmp_path), 1,
                   "cannot create the directory /proc/llmlab-", "/proc takes no new directories", "hydra.run.dir")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, which takes no new directories")
def test_a_cache_directory_the_file_system_refuses_is_one_line(tmp_path):
    """LLMLAB_CACHE under /proc: Hydra's "Error executing job" line, then a line that named
    hydra.run.dir; now one line that names the cache and its settings."""
    r = run_cli("tokenize", "tokenizer=byte", cwd=tmp_path, env={"LLMLAB_CACHE": "/proc/llmlab-cache/x"})
    one_line_error(r, 1, "cannot create the cache directory /proc/llmlab-cache/x",
                   "set cache_dir (or LLMLAB_CACHE) to a directory that can be written")


def test_a_path_under_an_unknown_users_home_is_taken_as_written(tmp_path):
    """``~name/...`` for a user this machine does not have stays as written, as a shell leaves
    it (pathlib's expanduser raised RuntimeError, a traceback)."""
    one_line_error(run_cli("report", "~llmlab-no-such-user/runs", cwd=tmp_path), 1,
                   "runs: ~llmlab-no-such-user/runs does not exist")


def test_missing_checkpoint(tmp_path):
    one_line_error(run_cli("sample", f"ckpt={tmp_path / 'nope'}", cwd=tmp_path), 1, "does not exist")


@pytest.mark.parametrize("args, fragment", [
    (["export", "ckpt=1e5", "out=x"], "ckpt: 1e5 does not exist"),  # Hydra reads 1e5 as 100000.0
    (["eval", "ckpt=0.10"], "ckpt: 0.10 does not exist"),
    (["sample", "ckpt=007"], "ckpt: 007 does not exist"),
])
def test_a_path_that_looks_like_a_number_is_taken_as_typed(tmp_path, args, fragment):
    one_line_error(run_cli(*args, cwd=tmp_path), 1, fragment)


def test_directory_that_is_not_a_checkpoint(tmp_path):
    (tmp_path / "empty").mkdir()
    one_line_error(run_cli("eval", f"ckpt={tmp_path / 'empty'}", cwd=tmp_path), 1, "is neither a checkpoint")


def test_empty_corpus(tmp_path):
    r = run_cli("tokenize", "data=text", f"data.paths=[{tmp_path}/missing/*.txt]", cwd=tmp_path)
    one_line_error(r, 1, f"data.paths: '{tmp_path}/missing/*.txt' matches no file")


def test_corpus_smaller_than_one_block(tmp_path):
    (tmp_path / "small.txt").write_text("just a few bytes\n" * 2)
    r = run_cli("train", "data=text", f"data.paths={tmp_path}/small.txt", *TINY, cwd=tmp_path)
    one_line_error(r, 1, "fewer than one block")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The run these tests share, made by real `llmlab tokenize` and `llmlab train` processes."""
    return train_a_tiny_run(tmp_path_factory, process=True)


def test_train_writes_a_run_directory(trained):
    root, result = trained
    run = root / "outputs" / "run"
    assert "params" in result.stdout and "KV cache" in result.stdout  # the model card
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["val_bpb"] > 0
    assert summary["decode_tokens_per_s"] > 0 and summary["seed"] == 1337  # for llmlab report
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "train/loss" in r] == [1, 2, 3, 4, 5, 6]
    assert all(k in records[0] for k in ("train/lr", "train/grad_norm", "perf/tokens_per_s", "perf/mfu"))
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000003", "step_000006"]
    # each checkpoint keeps the token frequencies of the training split (draft shortlists)
    import numpy as np

    from llmlab.data.shards import read_shard
    from llmlab.train.checkpoint import load_checkpoint
    data = root / summary["data"]  # absolute: the join keeps it
    meta = json.loads((data / "meta.json").read_text())
    train_ids = np.concatenate([read_shard(data / "train" / s["file"], meta["dtype"]) for s in meta["train"]["shards"]])
    counts = load_checkpoint(run / "checkpoints" / "step_000006").token_counts()
    assert counts.tolist() == np.bincount(train_ids, minlength=meta["vocab_size"]).tolist()
    assert (run / ".hydra" / "config.yaml").is_file() and (run / "config.yaml").is_file()
    assert "data:" in (run / "config.yaml").read_text()
    # what it printed is kept in its log, and the prompt completions in samples.jsonl
    log = (run / "train.log").read_text()
    assert "done: 6 steps" in log and "step      6  val loss" in log and "params" in log
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert {r["step"] for r in samples} == {3, 6} and all(r["prompt"] and "completion" in r for r in samples)
    assert f"{samples[-1]['prompt']!r} -> {samples[-1]['completion'][:120]!r}" in result.stdout


def test_sample_streams_text_from_a_run_dir(trained, monkeypatch):
    root, _ = trained
    r = run_cli("sample", "ckpt=outputs/run", 'prompt=def fib(', "max_new_tokens=12", "temperature=0", process=True, cwd=root)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("def fib(")
    assert "tokens/s" in r.stderr and "time to first token" in r.stderr
    again = run_cli("sample", "ckpt=outputs/run", 'prompt=def fib(', "max_new_tokens=12", "temperature=0", cwd=root)
    assert again.stdout == r.stdout  # greedy is deterministic
    # a layout kept by an earlier run (pack_weights=auto) is taken as it is, and the header says so
    from llmlab.model.packing import LAYOUT_FILE, layout_key
    from llmlab.train.checkpoint import build_model, load_checkpoint
    kept = root / ".cache" / LAYOUT_FILE
    saved = kept.read_text() if kept.exists() else None
    key = layout_key(build_model(load_checkpoint(root / "outputs" / "run"), torch.device("cpu")))
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(json.dumps({key: "transposed"}))
    monkeypatch.setattr("llmlab.model.packing._chosen", {})  # as in a new process (this call runs in this one)
    try:
        third = run_cli("sample", "ckpt=outputs/run", 'prompt=def fib(', "max_new_tokens=12", "temperature=0", cwd=root)
    finally:  # the other tests of this run find the cache as they would have
        kept.unlink() if saved is None else kept.write_text(saved)
    assert third.stdout == r.stdout
    assert f"packed weights (transposed; as measured before, kept in {kept})" in third.stderr


def test_sample_several(trained):
    root, _ = trained
    r = run_cli("sample", "ckpt=outputs/run/checkpoints/step_000003", "prompt=x", "num_samples=2",
                "max_new_tokens=5", "seed=1", cwd=root)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("--- prompt 1/1, sample ") == 2


def test_a_prompt_with_a_comma_is_one_prompt(trained):
    """From the shell ``prompt="x, y"`` arrives as ``prompt=x, y``: one prompt, not a sweep."""
    root, _ = trained
    r = run_cli("sample", "ckpt=outputs/run", "prompt=x, y", "max_new_tokens=3", "temperature=0", cwd=root)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("x, y")


def test_sample_a_batch_of_prompts_from_a_list_and_a_file(trained):
    root, _ = trained
    r = run_cli("sample", "ckpt=outputs/run", "prompt=['def ','class ',x]", "num_samples=2", "max_new_tokens=6",
                "min_p=0.05", "repetition_penalty=1.3", "hydra.run.dir=outputs/s-list", cwd=root)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("--- prompt ") == 6 and "--- prompt 3/3, sample 2/2 ---\nx" in r.stdout
    records = [json.loads(line) for line in (root / "outputs" / "s-list" / "samples.jsonl").read_text().splitlines()]
    assert [rec["prompt"] for rec in records if "prompt" in rec] == ["def ", "def ", "class ", "class ", "x", "x"]
    (root / "prompts.jsonl").write_text(json.dumps({"prompt": "a\nb"}) + "\n" + json.dumps({"prompt": "c"}) + "\n")
    f = run_cli("sample", "ckpt=outputs/run", "prompt_file=prompts.jsonl", "max_new_tokens=4", cwd=root)
    assert f.returncode == 0, f.stderr
    assert "--- prompt 1/2, sample 1/1 ---\na\nb" in f.stdout and "--- prompt 2/2" in f.stdout
    assert "longer than the model's context" not in f.stderr
    # a prompt longer than the context: the model sees its end, and that is said
    (root / "long.txt").write_text("short\n" + "y" * 40 + "\n")
    f = run_cli("sample", "ckpt=outputs/run", "prompt_file=long.txt", "max_new_tokens=2", cwd=root)
    assert f.returncode == 0, f.stderr
    assert ("prompt: prompt 2 of 2 is longer than the model's context of 32 tokens (the longest 40): "
            "the model sees only the last 32") in " ".join(f.stderr.split())
    one_line_error(run_cli("sample", "ckpt=outputs/run", "min_p=1.5", cwd=root), 2, "min_p")
    one_line_error(run_cli("sample", "ckpt=outputs/run", "prompt_file=nope.txt", cwd=root), 1, "prompt_file")
    # both given: the prompt was passed over in silence
    one_line_error(run_cli("sample", "ckpt=outputs/run", "prompt=x", "prompt_file=long.txt", cwd=root), 2,
                   "prompt: give prompt= or prompt_file=, not both")
    one_line_error(run_cli("sample", "ckpt=outputs/run", "prompt_file=~llmlab-no-such-user/p.txt", cwd=root), 1,
                   "prompt_file: ~llmlab-no-such-user/p.txt is not a file")
    one_line_error(run_cli("eval", "ckpt=outputs/run", "text=~llmlab-no-such-user/t.txt", cwd=root), 1,
                   "text: ~llmlab-no-such-user/t.txt is not a file")


def test_distil_a_draft_from_a_trained_run(trained):
    root, _ = trained
    corpus = root / "corpus"
    r = run_cli("train", "data=text", f"data.paths=[{corpus}/*]", *TINY, "model.d_model=16", "train.steps=4",
                "train.eval_every=0", "distill.teacher=outputs/run", "distill.data=teacher", "distill.gen_batch=4",
                "hydra.run.dir=outputs/distilled", cwd=root)
    assert r.returncode == 0, r.stderr
    assert "teacher agreement" in r.stdout
    summary = json.loads((root / "outputs" / "distilled" / "summary.json").read_text())
    assert summary["teacher"].endswith("step_000006") and 0 <= summary["teacher_agreement"] <= 1
    spec = run_cli("sample", "ckpt=outputs/run", "prompt=def ", "max_new_tokens=8", "temperature=0",
                   "draft=outputs/distilled", cwd=root)
    assert spec.returncode == 0, spec.stderr
    assert "acceptance" in spec.stderr


def test_sampling_in_bf16_on_the_cpu_casts_the_weights_once_and_keeps_autocasts_text(trained):
    """``precision=bf16`` decodes with one bf16 copy of each weight, not autocast's cast at
    every step: the same greedy text as those casts (``pack_weights=false``), and the header
    says which ran."""
    root, _ = trained
    common = ["ckpt=outputs/run", "prompt=def ", "max_new_tokens=20", "temperature=0", "precision=bf16"]
    once = run_cli("sample", *common, cwd=root)
    each_step = run_cli("sample", *common, "pack_weights=false", cwd=root)
    assert once.returncode == 0 and each_step.returncode == 0, once.stderr + each_step.stderr
    assert once.stdout == each_step.stdout and len(once.stdout) > len("def ")
    assert "weights cast to bf16 once" in once.stderr and "weights cast" not in each_step.stderr


def test_sample_decodes_on_the_cores_left_and_threads_n_pins_the_count(trained):
    """``threads=auto`` (the default) in a process of 2 threads keeps its steps' thread counts
    in samples.jsonl; ``threads=1`` writes the same text and leaves the process's count as it
    found it; a bad count is one line that names the key."""
    root, _ = trained
    common = ["ckpt=outputs/run", "prompt=def ", "max_new_tokens=16", "temperature=0", "stop_at_eos=false"]
    found = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        auto = run_cli("sample", *common, "hydra.run.dir=outputs/s-threads", cwd=root)
        pinned = run_cli("sample", *common, "threads=1", cwd=root)
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(found)
    assert auto.returncode == 0 and pinned.returncode == 0, auto.stderr + pinned.stderr
    assert auto.stdout == pinned.stdout and after == 2
    stats = json.loads((root / "outputs" / "s-threads" / "samples.jsonl").read_text().splitlines()[-1])["stats"]
    assert sum(stats["threads"].values()) == 15 and set(stats["threads"]) <= {"1", "2"}  # the first token is the prompt's
    one_line_error(run_cli("sample", "ckpt=outputs/run", "threads=0", cwd=root), 2,
                   "threads: must be auto or a whole number of threads, at least 1; got 0")


def test_speculative_sampling_with_a_draft_checkpoint(trained):
    root, _ = trained
    common = ["ckpt=outputs/run", "prompt=def ", "max_new_tokens=20", "temperature=0"]
    plain = run_cli("sample", *common, cwd=root)
    spec = run_cli("sample", *common, "draft=outputs/run/checkpoints/step_000003", "spec.k=3", cwd=root)
    assert spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout  # greedy speculative output is the target's greedy output
    assert "acceptance" in spec.stderr and "speed-up" in spec.stderr and "same tokens as plain greedy" in spec.stderr
    # plain F.linear instead of prepacked CPU weights: the same text, and the header says which ran
    unpacked = run_cli("sample", *common, "draft=outputs/run/checkpoints/step_000003", "pack_weights=false", cwd=root)
    assert unpacked.returncode == 0, unpacked.stderr
    assert unpacked.stdout == plain.stdout and "packed weights" not in unpacked.stderr
    packed = run_cli("sample", *common, "draft=outputs/run/checkpoints/step_000003", "pack_weights=true", cwd=root)
    assert packed.stdout == plain.stdout and ("packed weights" in packed.stderr) == packing_supported()
    unsure = run_cli("sample", *common, "draft=outputs/run/checkpoints/step_000003", "spec.min_confidence=0.5", cwd=root)
    assert unsure.returncode == 0, unsure.stderr
    assert unsure.stdout == plain.stdout and "min_confidence=0.5" in unsure.stderr
    # a draft that proposes only the 40 most frequent training tokens: the same greedy text
    short = run_cli("sample", *common, "draft=outputs/run/checkpoints/step_000003", "spec.draft_vocab=40", cwd=root)
    assert short.returncode == 0, short.stderr
    assert short.stdout == plain.stdout and "draft vocabulary 40 tokens" in short.stderr
    # checkpoints saved without token counts: one line naming the key
    for name in ("bare_target", "bare_draft"):
        shutil.copytree(root / "outputs/run/checkpoints/step_000003", root / name, dirs_exist_ok=True)
        (root / name / "token_counts.safetensors").unlink()
        manifest = json.loads((root / name / "manifest.json").read_text())  # as saved without them
        del manifest["files"]["token_counts.safetensors"]
        (root / name / "manifest.json").write_text(json.dumps(manifest))
    one_line_error(run_cli("sample", "ckpt=bare_target", "draft=bare_draft", "spec.draft_vocab=40", cwd=root), 1,
                   "spec.draft_vocab", "token counts")
    one_line_error(run_cli("sample", "ckpt=outputs/run", "spec.mtp=true", cwd=root), 1, "spec.mtp", "MTP heads")
    one_line_error(run_cli("sample", "ckpt=outputs/run", "spec.k=0", cwd=root), 2, "spec.k")


def test_eval_reports_loss_ppl_and_bpb(trained):
    root, _ = trained
    r = run_cli("eval", "ckpt=outputs/run", "hydra.run.dir=outputs/ev", process=True, cwd=root)
    assert r.returncode == 0, r.stderr
    res = json.loads((root / "outputs" / "ev" / "eval.json").read_text())
    import math
    assert res["ppl"] == pytest.approx(math.exp(res["loss"]), rel=1e-6)
    # byte tokenizer: one token per byte (plus separators), so bpb is close to loss / ln 2
    assert res["bpb"] == pytest.approx(res["loss"] / math.log(2), rel=0.05)
    assert "bits/byte" in r.stdout
    assert "bits/byte" in (root / "outputs" / "ev" / "eval.log").read_text()  # kept, not an empty log


def test_eval_a_text_file(trained, monkeypatch):
    import llmlab.train.device
    kept = []  # on the CPU eval keeps the memory each batch frees, as train does
    monkeypatch.setattr(llmlab.train.device, "keep_freed_memory", lambda: kept.append(True) or True)
    root, _ = trained
    (root / "other.txt").write_bytes(b"some other text to score\n" * 20 + b"and caf\xe9 in latin-1\n")
    r = run_cli("eval", "ckpt=outputs/run", "text=other.txt", "hydra.run.dir=outputs/ev2", cwd=root)
    assert r.returncode == 0, r.stderr
    assert "text: 1 byte sequences of other.txt are not UTF-8 and are scored as U+FFFD" in " ".join(r.stderr.split())
    assert kept == [True]
    assert json.loads((root / "outputs" / "ev2" / "eval.json").read_text())["source"] == "other.txt"
    # shorter than one window of the model's context: the line named the val split and model.max_seq_len
    (root / "short.txt").write_text("x = 1\n")
    one_line_error(run_cli("eval", "ckpt=outputs/run", "text=short.txt", cwd=root), 1,
                   "text: short.txt has ", " tokens, fewer than one window of 33 (the model's context of 32 and the "
                   "token after it); give more text")


def test_eval_max_batches_and_loss_by_position(trained):
    root, _ = trained
    r = run_cli("eval", "ckpt=outputs/run", "max_batches=1", "batch_size=2", "hydra.run.dir=outputs/ev3", cwd=root)
    assert r.returncode == 0, r.stderr
    out = root / "outputs" / "ev3"
    res = json.loads((out / "eval.json").read_text())
    assert res["windows"] == 2 and res["tokens_scored"] == 2 * 32  # one batch of 2 windows of 32
    pp = json.loads((out / "per_position.json").read_text())
    assert pp["position"] == list(range(32)) and pp["tokens"] == [2] * 32
    assert abs(sum(pp["loss"]) / 32 - res["loss"]) < 1e-6
    assert (out / "per_position.png").read_bytes()[:4] == b"\x89PNG"


def test_eval_a_datasets_dataset_from_local_files(trained):
    root, _ = trained
    rows = [{"text": f"def f{i}(x):\n    return x * {i}\n"} for i in range(60)]
    (root / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = run_cli("eval", "ckpt=outputs/run", "data=hf", f"data.path={root}/rows.jsonl", "data.val_fraction=0.5",
                "hydra.run.dir=outputs/ev-hf", cwd=root)
    assert r.returncode == 0, r.stderr
    res = json.loads((root / "outputs" / "ev-hf" / "eval.json").read_text())
    assert res["source"] == "hf:val" and res["tokens_scored"] > 0 and res["bpb"] > 0


def test_eval_attention_analysis_writes_numbers_and_figures(trained):
    root, _ = trained
    r = run_cli("eval", "ckpt=outputs/run", "analysis=attention", "analysis.windows=2", "analysis.example_tokens=12",
                "max_batches=1", "hydra.run.dir=outputs/attn", cwd=root)
    assert r.returncode == 0, r.stderr
    out = root / "outputs" / "attn"
    res = json.loads((out / "attention.json").read_text())
    assert set(res["splits"]) == {"train", "val"}
    heads = res["splits"]["val"]["layers"][0]["heads"]
    assert len(heads) == 2 and all(0 < h["normalized_support"] <= 1 for h in heads)
    assert all(2 ** h["entropy_bits"] <= h["support"] + 1e-9 for h in heads)  # mean of 2^H >= 2^(mean H)
    for name in ("attention_support_hist.png", "attention_support_by_length.png", "attention_support_grid.png",
                 "attention_heatmap_layer0.png"):
        assert name in res["figures"] and (out / name).read_bytes()[:4] == b"\x89PNG"
    assert "normalised support" in r.stdout.replace("\n", " ") or "normalised" in r.stdout
    bad = run_cli("eval", "ckpt=outputs/run", "analysis=attention", "analysis.windows=0", cwd=root)
    one_line_error(bad, 2, "analysis.windows")


def test_export_to_transformers_scores_like_llmlab_eval(trained):
    root, _ = trained
    import numpy as np

    from tests.helpers import hf_loss
    r = run_cli("export", "ckpt=outputs/run", "out=exported", process=True, cwd=root)
    assert r.returncode == 0, r.stderr
    assert "Qwen3ForCausalLM" in r.stdout  # the default model's q/k norms are Qwen3's
    text = "def add(a, b):\n    return a + b\n" * 12
    (root / "score.txt").write_text(text)
    e = run_cli("eval", "ckpt=outputs/run", "text=score.txt", "hydra.run.dir=outputs/ev-export", cwd=root)
    assert e.returncode == 0, e.stderr
    ours = json.loads((root / "outputs" / "ev-export" / "eval.json").read_text())["loss"]
    import transformers
    tokens = np.asarray(transformers.AutoTokenizer.from_pretrained(root / "exported").encode(text), dtype=np.int64)
    assert abs(hf_loss(root / "exported", tokens, 32) - ours) < 1e-4
    one_line_error(run_cli("export", "ckpt=outputs/run", "out=exported", cwd=root), 1, "out:", "overwrite=true")
    # overwrite=true replaces an earlier export; it deleted any directory, the checkpoint's own included
    again = run_cli("export", "ckpt=outputs/run", "out=exported", "overwrite=true", cwd=root)
    assert again.returncode == 0, again.stderr
    one_line_error(run_cli("export", "ckpt=outputs/run", "out=outputs", "overwrite=true", cwd=root), 1,
                   "out: outputs holds the checkpoint being exported", "overwrite=true would delete it")
    (root / "mine").mkdir()
    (root / "mine" / "notes.txt").write_text("keep me")
    one_line_error(run_cli("export", "ckpt=outputs/run", "out=mine", "overwrite=true", cwd=root), 1,
                   "out: mine is not an earlier export (it holds notes.txt)")
    assert (root / "mine" / "notes.txt").read_text() == "keep me"
    assert (root / "outputs" / "run" / "checkpoints").is_dir()
    # out= under a file: one line (mkdir of the file's name), as for a run directory
    one_line_error(run_cli("export", "ckpt=outputs/run", "out=score.txt/hf", cwd=root), 1,
                   "cannot write a file (score.txt): a file stands where a directory belongs")
    one_line_error(run_cli("export", "ckpt=outputs/run", "format=onnx", cwd=root), 2, "format", "hf")


def test_corrupt_weights_are_refused(trained):
    root, _ = trained
    import shutil
    src = root / "outputs" / "run" / "checkpoints" / "step_000006"
    bad = root / "bad_ckpt"
    shutil.copytree(src, bad)
    (bad / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes()[:100])
    one_line_error(run_cli("sample", f"ckpt={bad}", cwd=root), 1, "truncated or corrupt")


def test_multirun_sweep(trained):
    root, _ = trained
    r = run_cli("train", "-m", "optim.lr=1e-3,3e-3", "data=text", f"data.paths=[{root}/corpus/*]", *TINY,
                "train.steps=2", "hydra.sweep.dir=outputs/sweep", "hydra.callbacks.report.baseline=0.003", cwd=root)
    assert r.returncode == 0, r.stderr
    sweep = root / "outputs" / "sweep"
    runs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert [r.split("_", 1)[0] for r in runs] == ["0", "1"]
    assert runs == ["0_optim.lr=0.001", "1_optim.lr=0.003"]  # named by what the sweep varies
    for d, lr in zip(runs, ("0.001", "0.003")):
        assert f"optim.lr={lr}" in (sweep / d / ".hydra" / "overrides.yaml").read_text()
        assert json.loads((sweep / d / "summary.json").read_text())["steps"] == 2
    assert "[/" not in r.stderr  # user paths with brackets print as text
    # the sweep compares its runs when it ends, against the baseline it was given
    report = json.loads((sweep / "report.json").read_text())
    assert [g["group"] for g in report["groups"]] == ["optim.lr=0.001", "optim.lr=0.003"]
    assert report["baseline"] == "optim.lr=0.003" and "unfinished" not in report
    (c,) = report["comparisons"]
    summaries = [json.loads((sweep / d / "summary.json").read_text()) for d in runs]
    assert c["group"] == "optim.lr=0.001" and c["pairs"] == 1
    assert c["diff_mean"] == pytest.approx(summaries[0]["val_loss"] - summaries[1]["val_loss"])
    assert (sweep / "report.md").is_file() and f"report: {Path('outputs') / 'sweep' / 'report.md'}" in r.stdout
    # a baseline that names no group: the finished jobs are skipped, and one line says what is allowed
    bad = run_cli("train", "-m", "optim.lr=1e-3,3e-3", "data=text", f"data.paths=[{root}/corpus/*]", *TINY,
                  "train.steps=2", "hydra.sweep.dir=outputs/sweep", "hydra.callbacks.report.baseline=0.1", cwd=root)
    assert bad.stdout.count("finished already") == 2
    one_line_error(bad, 1, "baseline: '0.1' names no single group; allowed: 0: optim.lr=0.001, 1: optim.lr=0.003")


def test_a_job_that_diverges_does_not_stop_its_sweep(trained):
    """An lr sweep where one lr diverges: the other jobs still run, the report compares those
    and lists the failed job, and the sweep exits 1 with one line saying so."""
    root, _ = trained
    r = run_cli("train", "-m", "optim.lr=1e30,1e-3,3e-3", "train.grad_clip=0", "data=text",
                f"data.paths=[{root}/corpus/*]", *TINY, "train.steps=4", "train.eval_every=0",
                "hydra.sweep.dir=outputs/diverge", cwd=root)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    sweep = root / "outputs" / "diverge"
    failed = sweep / "0_optim.lr=1e+30" / "failed.txt"
    assert failed.read_text().startswith("training diverged: the loss is nan")
    assert "llmlab: error: job 0 (0_optim.lr=1e+30): training diverged" in r.stderr
    assert not (failed.parent / "summary.json").exists()
    for job in ("1_optim.lr=0.001", "2_optim.lr=0.003"):
        assert json.loads((sweep / job / "summary.json").read_text())["steps"] == 4
    report = json.loads((sweep / "report.json").read_text())
    assert [g["group"] for g in report["groups"]] == ["optim.lr=0.001", "optim.lr=0.003"]
    assert list(report["unfinished"]) == ["0_optim.lr=1e+30"]
    assert "## Jobs that did not finish" in (sweep / "report.md").read_text()
    assert r.stderr.strip().splitlines()[-1] == (
        "llmlab: error: 1 of 3 jobs did not finish; running the same sweep command again retries them "
        "and skips the finished ones")


def test_mlm_checkpoint_is_refused_by_sample_and_scored_by_eval(trained):
    root, _ = trained
    r = run_cli("train", "model=bert", "data=text", f"data.paths=[{root}/corpus/*]", *TINY, "train.steps=2",
                "hydra.run.dir=outputs/bert", cwd=root)
    assert r.returncode == 0, r.stderr
    one_line_error(run_cli("sample", "ckpt=outputs/bert", cwd=root), 1, "objective=mlm", "objective=clm")
    e = run_cli("eval", "ckpt=outputs/bert", "hydra.run.dir=outputs/bert-eval", cwd=root)
    assert e.returncode == 0, e.stderr
    res = json.loads((root / "outputs" / "bert-eval" / "eval.json").read_text())
    assert res["objective"] == "mlm" and res["bpb"] is None and 0 <= res["accuracy"] <= 1
    assert "masked accuracy" in e.stdout


def test_the_same_sweep_again_skips_finished_runs_and_resumes_the_rest(trained):
    """A train sweep's directory is named by its overrides, so repeating the command finds
    its jobs: a finished one is skipped, an unfinished one continues from its checkpoint."""
    root, _ = trained
    args = ["train", "-m", "seed=0,1", "data=text", f"data.paths=[{root}/corpus/*]", *TINY, "train.steps=4",
            "train.ckpt_every=2", "train.eval_every=0"]
    first = run_cli(*args, cwd=root)
    assert first.returncode == 0, first.stderr
    (sweep,) = list((root / "outputs" / "train-sweep").iterdir())
    assert sweep.name.startswith("seed=0,1_data=text")
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [j.name for j in jobs] == ["0_seed=0", "1_seed=1"]
    summary0 = (jobs[0] / "summary.json").read_text()
    # job 1 "died" after its step-2 checkpoint
    (jobs[1] / "summary.json").unlink()
    shutil.rmtree(jobs[1] / "checkpoints" / "step_000004")

    again = run_cli(*args, cwd=root)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("finished already") == 1
    assert f"resumed from {jobs[1] / 'checkpoints' / 'step_000002'} at step 2" in again.stdout
    assert (jobs[0] / "summary.json").read_text() == summary0  # untouched
    assert json.loads((jobs[1] / "summary.json").read_text())["steps"] == 4
    assert list((root / "outputs" / "train-sweep").iterdir()) == [sweep]


def test_a_run_resolves_its_config_in_the_check_and_in_its_app_only(tmp_path, monkeypatch):
    """Hydra composes a run's config once; `CheckJobs` resolves it into the job before the
    directory exists, and the app resolves it again (nothing is handed over between them): the
    model sections are parsed twice, not once more per part built."""
    from llmlab.model.config import ModelSpec

    calls = []
    original = ModelSpec.from_config.__func__
    monkeypatch.setattr(ModelSpec, "from_config",
                        classmethod(lambda cls, cfg, vocab_size: calls.append(1) or original(cls, cfg, vocab_size)))
    (tmp_path / "c.txt").write_text("def f(x):\n    return x\n" * 200)
    check_cli("train", "data=text", "data.paths=[c.txt]", *TINY, "train.steps=2", "train.eval_every=0",
              "hydra.run.dir=run", cwd=tmp_path)
    assert (tmp_path / "run" / "summary.json").is_file()
    assert len(calls) == 2


def test_a_runs_hydra_files_are_hydras_own_and_its_config_is_what_cfg_job_shows(tmp_path):
    """Hydra composes and writes a run's .hydra/ files itself: the job's config.yaml is the
    config `--cfg job` prints for the same overrides, and overrides.yaml what was typed."""
    (tmp_path / "c.txt").write_text("def f(x):\n    return x\n" * 200)
    args = ["data=text", "data.paths=[c.txt]", *TINY, "train.steps=1", "train.eval_every=0"]
    check_cli("train", *args, "hydra.run.dir=run", cwd=tmp_path)
    shown = run_cli("train", *args, "--cfg", "job", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    hydra_dir = tmp_path / "run" / ".hydra"
    assert sorted(f.name for f in hydra_dir.iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    assert yaml.safe_load((hydra_dir / "config.yaml").read_text()) == yaml.safe_load(shown.stdout)
    assert yaml.safe_load((hydra_dir / "overrides.yaml").read_text()) == args
    assert yaml.safe_load((hydra_dir / "hydra.yaml").read_text())["hydra"]["callbacks"]["check"]["command"] == "train"


def test_a_sweep_with_a_mistake_in_one_job_stops_before_any_directory(tmp_path):
    """`CheckJobs` composes and resolves every combination of a sweep before Hydra's launcher
    makes the sweep directory: a value that only one job gets is still one line, and nothing
    is written."""
    r = run_cli("train", "-m", *TINY, "train.steps=1,0", "hydra.sweep.dir=sweep", cwd=tmp_path)
    one_line_error(r, 2, "train.steps")
    assert not (tmp_path / "sweep").exists() and not (tmp_path / "outputs").exists()


def test_llmlab_uses_hydra_by_its_public_api_only():
    """No module imports Hydra's private package or replaces an attribute of a Hydra or
    OmegaConf class: a Hydra release may change those at will."""
    import re

    from tests.conftest import REPO

    private = re.compile(r"hydra\._internal|^\s*(Hydra|ConfigLoaderImpl|ConfigStore|Sweeper|BasicSweeper|OmegaConf|"
                         r"DictConfig)\.[A-Za-z_]+\s*=", re.M)
    found = [f"{path.relative_to(REPO)}: {m.group(0).strip()}" for path in sorted((REPO / "llmlab").rglob("*.py"))
             for m in private.finditer(path.read_text())]
    assert found == []
