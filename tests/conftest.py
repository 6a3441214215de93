"""Shared fixtures: small corpora written on the fly, tiny models, and the CLI as a user runs it."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

# The suite's processes share the cores with a second pytest worker (and on a busy machine with
# more): a command started as a subprocess with torch's default of a thread per core waits for
# a busy core at every parallel region. Tiny models' training steps ran 2.5-3x slower that way
# (60 steps of a d 128 model beside a test run: 43 s against 13 s). One thread each, as in the
# tests' own process (`one_thread` below), unless the environment already says otherwise.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# precision=auto picks bf16 on a CPU with bf16 units (AMX, AVX-512 BF16), and this suite runs on
# CPUs with and without them: it pins auto to fp32 (the numbers its tests compare are fp32's),
# and the tests of that choice set LLMLAB_CPU_BF16 themselves
os.environ["LLMLAB_CPU_BF16"] = "0"

# torch (and the model, which imports it) load where a test needs them, not here: pytest-xdist's
# controller process reads this file too, and runs no test (2.5 s less before the workers start)
if TYPE_CHECKING:
    from llmlab.model.transformer import ModelSpec, Transformer

REPO = Path(__file__).resolve().parent.parent

# A small corpus with code, prose, Unicode and emoji; enough for a few blocks of tokens.
SAMPLE_TEXTS = {
    "alpha.py": "def add(a, b):\n    return a + b\n\n\nclass Point:\n    def __init__(self, x, y):\n"
                "        self.x = x\n        self.y = y\n" * 6,
    "beta.txt": "The quick brown fox jumps over the lazy dog. Ünïcödé ßtraße — naïve café 😀🚀\n" * 12,
    "gamma.md": "# Notes\n\n- item one\n- item two: `x = [i * i for i in range(10)]`\n\n" * 10,
    "delta.py": "import os\nimport sys\n\nfor k, v in sorted(os.environ.items()):\n    print(k, v)\n" * 8,
}


# The test files that take longest, longest first (seconds in an idle `make test` on the 2-core
# machine, torch 2.13): `make test` hands whole files to its workers (pytest-xdist, --dist
# loadfile, with --no-loadscope-reorder so that xdist keeps this order instead of sorting files by
# their number of tests) in collection order, so these start first and the run ends on short
# files, not with one worker on a long file while the other has nothing left. The files not
# named here take under 2 s each and follow in their own order.
LONGEST_FIRST = (
    "test_cli.py",  # 87
    "sample/test_speculative.py",  # 42
    "test_untrusted_input.py",  # 36
    "model/test_transformer.py",  # 34
    "train/test_distributed.py",  # 28
    "study/test_scaling.py",  # 28
    "test_links.py",  # 23
    "train/test_faults.py",  # 20
    "train/test_branches.py",  # 17
    "fuzz/test_fuzz.py",  # 16
    "train/test_state.py",  # 13
    "train/test_loop.py",  # 12
    "data/test_shards.py",  # 11
    "train/test_init.py",  # 11
    "export/test_hf_load.py",  # 10
    "train/test_budget.py",  # 11
    "train/test_settings.py",  # 9
    "test_extensions.py",  # 8
    "export/test_hf.py",  # 8
    "train/test_loss_curve.py",  # 7
    "model/test_presets.py",  # 7
    "train/test_distill.py",  # 7
    "study/test_report.py",  # 7
    "test_interruptions.py",  # 6
    "model/test_mup.py",  # 5
    "train/test_groups.py",  # 5
    "train/test_schedule_optim.py",  # 4
    "model/test_ring.py",  # 4
    "data/test_prepare.py",  # 4
    "train/test_loggers.py",  # 4
    "model/test_dsa.py",  # 4
    "train/test_context_parallel.py",  # 2
    "test_layers.py",  # 2
    "test_readme.py",  # 2
    "sample/test_threads.py",  # 1
)


def pytest_collection_modifyitems(session, config, items):
    stale = [name for name in LONGEST_FIRST if not (REPO / "tests" / name).is_file()]
    if stale:  # a renamed or removed file would quietly lose its place
        raise pytest.UsageError(f"tests/conftest.py: LONGEST_FIRST names no such test file: {', '.join(stale)}")
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def place(item) -> int:
        try:
            return rank.get(Path(item.path).relative_to(REPO / "tests").as_posix(), len(rank))
        except ValueError:
            return len(rank)
    items.sort(key=place)  # stable: every file's tests keep their order, the other files theirs


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """The tests' models are tiny: a second intra-op thread costs more in start-up than it
    saves, and on a busy machine every extra thread waits for a core (the speculative-decoding
    tests, 1,000 short generations each, ran 4x slower with two threads under load). Commands
    the tests start as subprocesses get one thread too, through OMP_NUM_THREADS (above)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def few_replicates(monkeypatch):
    """For a test that asserts no interval's width: 40 bootstrap replicates instead of 200 in the
    scaling report's fits (commands run in this process)."""
    from llmlab.study import surface

    monkeypatch.setattr(surface, "BOOTSTRAPS", 40)


def write_corpus(root: Path, repeat: int = 1) -> Path:
    """``root/corpus``: the sample files, each text repeated ``repeat`` times."""
    d = root / "corpus"
    d.mkdir()
    for name, text in SAMPLE_TEXTS.items():
        (d / name).write_text(text * repeat, encoding="utf-8")
    return d


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    return write_corpus(tmp_path)


def test_configs(registry) -> list[dict]:
    """A small config of every kind a registry holds (each class's ``test_settings``), so that
    a new kind gets every generic test with no test edit."""
    return [test_config(registry, name) for name in registry.names()]


def test_config(registry, name: str) -> dict:
    return {registry.kind_key: name, **getattr(registry.get(name), "test_settings", {})}


test_configs.__test__ = test_config.__test__ = False  # helpers, not tests


def tiny_spec(attention: dict | None = None, pos: dict | None = None, norm: dict | None = None,
              objective: dict | None = None, ffn: dict | str | None = None, vocab_size: int = 97,
              **model) -> ModelSpec:
    from llmlab.model.transformer import ModelSpec

    model_cfg = {"d_model": 32, "n_layers": 2, "n_heads": 4, "max_seq_len": 32, **model}
    ffn = {"kind": ffn} if isinstance(ffn, str) else ffn or {"kind": "swiglu"}
    return ModelSpec.from_config({"model": model_cfg, "attention": attention or {"kind": "mha"}, "ffn": ffn,
                                  "norm": norm or {"placement": "pre", "kind": "rmsnorm"},
                                  "pos": pos or {"kind": "rope"}, "objective": objective or {"kind": "clm"}},
                                 vocab_size)


def tiny_model(seed: int = 0, **kwargs) -> Transformer:
    import torch

    from llmlab.model.transformer import Transformer

    torch.manual_seed(seed)
    return Transformer(tiny_spec(**kwargs)).eval()


def check_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``llmlab <args>`` in this process, for command lines that must stop at the checks, before
    Hydra runs anything. A case that got past the checks would run here and fail its test."""
    return run_cli(*args, cwd=cwd)


def the_error_line(stderr: str) -> str | None:
    """The refusal in ``stderr`` when it is one ``llmlab: error:`` line, and the last line
    (progress lines may come before it); None for anything else (several error lines, a
    traceback's last line, none)."""
    err = stderr.strip()
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    if len(errors) != 1 or not errors[0].startswith("llmlab: error: ") or err.splitlines()[-1] != errors[0]:
        return None
    return errors[0]


@functools.lru_cache(maxsize=None)
def _cpu_peak() -> tuple[str, dict]:
    """This machine's one-thread matmul peak as llmlab keeps it (its cache key and entry),
    probed once per test process."""
    import torch

    from llmlab.train import mfu
    flops, _ = mfu.measured_matmul_peak("cpu", torch.float32)
    return mfu._peak_key("cpu", torch.float32, 1024), {"flops": flops, "source": "probe"}


def seed_peak(cache: Path) -> None:
    """Put the CPU's matmul peak in the llmlab cache ``cache`` a training subprocess will use,
    unless it holds one: as a user's cache holds it after their first run. Each test has a
    cache of its own, so each training process would probe the peak again (1.6 s on one
    thread, then not kept when the machine is busy, so every run paid it). The probe itself
    is tested in tests/train/test_mfu.py."""
    if (cache / "peak.json").exists():
        return
    key, entry = _cpu_peak()
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "peak.json").write_text(json.dumps({key: entry}))


def run_cli(*args: str, cwd: Path, timeout: float = 300, env: dict | None = None,
            process: bool = False, preexec_fn=None) -> subprocess.CompletedProcess:
    """``llmlab <args>`` in ``cwd``, as a user runs it, with the cache in ``cwd/.cache`` and
    wandb off.

    By default in this process: the same code as from the shell (`llmlab.cli.main`, Hydra's
    app included) with argv, the working directory, the environment and the streams swapped
    for the call, and an exception that would end the program printed as the interpreter
    would print it, exit status 1. That saves the 2 to 3 s of a fresh interpreter (torch's
    import) per call. ``process=True`` runs ``python -m llmlab`` in a subprocess: for tests
    about the process itself (signals, kill -9, exit at interpreter shutdown, resource
    limits, torchrun) and for one real run of each command; ``preexec_fn`` runs in that
    subprocess before it starts (a resource limit)."""
    env = {"LLMLAB_CACHE": str(cwd / ".cache"), "WANDB_MODE": "disabled", **(env or {})}
    if process:
        seed_peak(Path(env["LLMLAB_CACHE"]))
        full_env = {**os.environ, "PYTHONPATH": str(REPO), **env}
        full_env.pop("WANDB_API_KEY", None)
        return subprocess.run([sys.executable, "-m", "llmlab", *args], cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, env=full_env, preexec_fn=preexec_fn)
    assert preexec_fn is None, "preexec_fn needs process=True"
    return _in_process(list(args), Path(cwd), env)


def _in_process(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    import logging
    import traceback

    from hydra.core.global_hydra import GlobalHydra

    from llmlab.cli import main

    out, err, code = io.StringIO(), io.StringIO(), 0
    saved_env, saved_argv, before = dict(os.environ), list(sys.argv), os.getcwd()
    root = logging.getLogger()
    saved_logging = (list(root.handlers), root.level)
    os.environ.update(env)
    os.environ.pop("WANDB_API_KEY", None)
    os.chdir(cwd)
    GlobalHydra.instance().clear()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(args)
            except SystemExit as e:
                if e.code is None or isinstance(e.code, int):
                    code = e.code or 0
                else:  # what the interpreter does with SystemExit("text")
                    print(e.code, file=sys.stderr)
                    code = 1
            except Exception:  # what the interpreter prints for an uncaught exception
                traceback.print_exc()
                code = 1
    finally:
        GlobalHydra.instance().clear()
        for h in root.handlers:  # Hydra's job logging: its file handler holds the run's log open
            if h not in saved_logging[0]:
                h.close()
        root.handlers[:] = saved_logging[0]
        root.setLevel(saved_logging[1])
        os.chdir(before)
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv[:] = saved_argv
    return subprocess.CompletedProcess(["llmlab", *args], code, out.getvalue(), err.getvalue())
