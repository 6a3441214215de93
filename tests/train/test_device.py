"""precision=auto: bf16 on a CPU that multiplies bf16 in hardware, fp32 on one that does not,
and the start line says which and why."""

import pytest
import torch

from llmlab.train.device import cpu_bf16_unit, precision_note, resolve_precision
from tests.conftest import run_cli
from tests.helpers import TINY

CPU = torch.device("cpu")
AVX2 = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma\n"
SAPPHIRE = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16 amx_int8\n"
COOPER = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"


def test_the_cpus_bf16_unit_is_read_from_its_flags(monkeypatch):
    monkeypatch.delenv("LLMLAB_CPU_BF16")
    assert cpu_bf16_unit(AVX2) is None
    assert cpu_bf16_unit(SAPPHIRE) == "amx_bf16"
    assert cpu_bf16_unit(COOPER) == "avx512_bf16"
    assert cpu_bf16_unit("") is None
    monkeypatch.setenv("LLMLAB_CPU_BF16", "1")
    assert cpu_bf16_unit(AVX2) == "LLMLAB_CPU_BF16=1"
    monkeypatch.setenv("LLMLAB_CPU_BF16", "0")
    assert cpu_bf16_unit(SAPPHIRE) is None


@pytest.mark.parametrize("unit, train, sample", [("1", "bf16", "fp32"), ("0", "fp32", "fp32")])
def test_auto_is_bf16_for_training_and_evaluation_on_a_cpu_with_the_units(monkeypatch, unit, train, sample):
    monkeypatch.setenv("LLMLAB_CPU_BF16", unit)
    assert resolve_precision("auto", CPU) == train
    assert resolve_precision("auto", CPU, cpu_bf16=False) == sample  # decoding: not measured faster
    assert resolve_precision("fp32", CPU) == "fp32" and resolve_precision("bf16", CPU) == "bf16"
    note = precision_note("auto", train, CPU)
    assert note.startswith(train + ", auto")
    assert ("LLMLAB_CPU_BF16=1" in note) == (unit == "1")
    assert precision_note("fp32", "fp32", CPU) == "fp32"  # a precision given is said as given


def test_the_start_line_says_the_precision_and_why(corpus_dir, tmp_path):
    import json

    from llmlab.train import mfu
    from tests.conftest import seed_peak

    # a bf16 peak beside the fp32 one, as a user's cache holds it after a first run (probing it
    # on a CPU without bf16 units takes a minute, and this test is not about MFU)
    seed_peak(tmp_path / ".cache")
    peaks = json.loads((tmp_path / ".cache" / "peak.json").read_text())
    fp32 = next(iter(peaks.values()))
    peaks[mfu._peak_key("cpu", torch.bfloat16, 1024)] = {**fp32, "source": "probe"}
    (tmp_path / ".cache" / "peak.json").write_text(json.dumps(peaks))
    args = ["data=text", f"data.paths=[{corpus_dir}/*]", *TINY, "train.steps=2", "train.eval_every=0"]
    on = run_cli("train", *args, "hydra.run.dir=on", cwd=tmp_path, env={"LLMLAB_CPU_BF16": "1"})
    assert on.returncode == 0, on.stderr
    assert "device cpu (bf16, auto: this CPU multiplies bf16 in hardware (LLMLAB_CPU_BF16=1); precision=fp32" in on.stdout
