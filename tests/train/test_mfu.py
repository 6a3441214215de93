import json

import pytest
import torch

from llmlab.train.device import resolve_device, resolve_precision
from llmlab.train.mfu import device_peak_flops, gpu_peak


def test_gpu_names_map_to_their_data_sheet_peaks():
    assert gpu_peak("NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert gpu_peak("NVIDIA H200", "bf16") == 989e12
    assert gpu_peak("NVIDIA H100 PCIe", "bf16") == 756e12
    assert gpu_peak("NVIDIA A100-SXM4-80GB", "bf16") == 312e12
    assert gpu_peak("NVIDIA A100-SXM4-80GB", "fp32") == 156e12  # TF32 runs at half rate
    assert gpu_peak("NVIDIA L40S", "bf16") == 362e12
    assert gpu_peak("Some Future GPU", "bf16") is None


def test_cpu_peak_is_measured():
    peak, source = device_peak_flops(torch.device("cpu"), "fp32")
    assert peak > 1e8 and "measured" in source


def test_auto_device_and_precision_on_this_machine():
    device = resolve_device("auto")
    if device.type == "cpu":
        assert resolve_precision("auto", device) == "fp32"
    assert resolve_precision("bf16", device) == "bf16"


def test_unknown_device_and_precision_name_the_key():
    from llmlab.errors import ConfigError
    with pytest.raises(ConfigError, match=r"^device: unknown device 'gpu0'"):
        resolve_device("gpu0")
    with pytest.raises(ConfigError, match=r"^precision: unknown 'fp8'; allowed: auto, fp32, bf16, fp16$"):
        resolve_precision("fp8", torch.device("cpu"))


def test_apple_chips_map_to_cores_times_the_per_core_rate():
    from llmlab.train.mfu import apple_gpu_peak
    assert apple_gpu_peak("Apple M1", 8) == pytest.approx(2.6e12, rel=0.01)
    assert apple_gpu_peak("Apple M2 Pro", 19) == pytest.approx(19 * 358e9)
    assert apple_gpu_peak("Apple M9 Ultra", 80) is None  # unknown generation: measure instead
    assert apple_gpu_peak("Apple M2", None) is None
    assert apple_gpu_peak("Intel(R) Core(TM) i9", 8) is None


def test_the_cpu_probe_runs_once_per_machine_and_is_cached_on_disk(tmp_path, monkeypatch):
    from llmlab.train import mfu
    monkeypatch.setenv("LLMLAB_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(mfu, "_probe", lambda *a: calls.append(a) or (1.5e11, 0.01, 0.02))
    mfu.measured_matmul_peak.cache_clear()
    assert mfu.measured_matmul_peak("cpu") == (1.5e11, "measured now")
    mfu.measured_matmul_peak.cache_clear()  # a new process
    assert mfu.measured_matmul_peak("cpu") == (1.5e11, "cached") and len(calls) == 1
    [entry] = json.loads((tmp_path / "peak.json").read_text()).values()
    assert entry["flops"] == 1.5e11 and entry["other_load"] == 0.02
    mfu.measured_matmul_peak.cache_clear()


@pytest.mark.parametrize("spread,load", [(0.01, 0.6), (0.3, 0.0)])
def test_a_probe_taken_under_contention_is_not_kept(tmp_path, monkeypatch, spread, load):
    """A probe while other work ran (high other load, or rounds that disagree) serves its run
    only; the next run measures again instead of inheriting a low peak for good."""
    from llmlab.train import mfu
    monkeypatch.setenv("LLMLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(mfu, "_probe", lambda *a: (4.9e10, spread, load))
    mfu.measured_matmul_peak.cache_clear()
    peak, note = mfu.measured_matmul_peak("cpu")
    assert peak == 4.9e10 and "under contention" in note and "not kept" in note
    assert not (tmp_path / "peak.json").exists()
    mfu.measured_matmul_peak.cache_clear()


def test_a_run_faster_than_the_peak_raises_it(tmp_path, monkeypatch):
    """A stale low peak in the cache (49 GFLOP/s from a probe under load) and a run that
    reaches 120: the probe runs again and the cache keeps the highest of the three."""
    from llmlab.train import mfu
    monkeypatch.setenv("LLMLAB_CACHE", str(tmp_path))
    mfu.measured_matmul_peak.cache_clear()
    key = mfu._peak_key("cpu", torch.float32, 1024)
    (tmp_path / "peak.json").write_text(json.dumps({key: {"flops": 4.9e10}}))
    monkeypatch.setattr(mfu, "_probe", lambda *a: (1.1e11, 0.01, 0.0))
    assert mfu.raise_peak("cpu", torch.float32, achieved=1.2e11) == 1.2e11  # the run beat the probe
    assert json.loads((tmp_path / "peak.json").read_text())[key]["source"] == "reached by a run"
    assert mfu.measured_matmul_peak("cpu") == (1.2e11, "cached")
    monkeypatch.setattr(mfu, "_probe", lambda *a: (1.5e11, 0.01, 0.0))
    assert mfu.raise_peak("cpu", torch.float32, achieved=1.3e11) == 1.5e11
    mfu.measured_matmul_peak.cache_clear()


@pytest.mark.parametrize("text,why", [("{\"cpu|x\": {\"flops\": 1e11", "not JSON"), ("[1e11]", "not a JSON object"),
                                      ("{\"cpu|x\": {\"flops\": \"fast\"}, \"cpu|y\": -1}", "2 entries not an object"),
                                      # a peak no device reaches: every run's MFU read 0.0%
                                      ("{\"cpu|x\": {\"flops\": 1e30}}", "1 entry not an object with a positive "
                                                                            "flops below 1e+17")])
def test_a_damaged_peak_file_is_said_and_written_anew(tmp_path, monkeypatch, text, why):
    """peak.json edited by hand or cut short: the run measures the peak, its note (the run's
    header line) names the file and what was wrong, and the file is written whole again with
    the new peak, keeping the entries that were usable."""
    from llmlab.train import mfu
    monkeypatch.setenv("LLMLAB_CACHE", str(tmp_path))
    (tmp_path / "peak.json").write_text(text)
    monkeypatch.setattr(mfu, "_probe", lambda *a: (1.5e11, 0.01, 0.0))
    mfu.measured_matmul_peak.cache_clear()
    peak, note = mfu.measured_matmul_peak("cpu")
    assert peak == 1.5e11 and note.startswith(f"measured now; {tmp_path / 'peak.json'}: {why}")
    assert note.endswith("and the file written anew")
    kept = json.loads((tmp_path / "peak.json").read_text())
    assert list(kept) == [mfu._peak_key("cpu", torch.float32, 1024)] and mfu._cached_peaks() == (kept, None)
    mfu.measured_matmul_peak.cache_clear()


def test_a_damaged_peak_file_is_left_as_it_is_while_nothing_replaces_it(tmp_path, monkeypatch):
    """A probe under contention is not kept, so the damaged file is not written over either;
    the note says both."""
    from llmlab.train import mfu
    monkeypatch.setenv("LLMLAB_CACHE", str(tmp_path))
    (tmp_path / "peak.json").write_text("{cut short")
    monkeypatch.setattr(mfu, "_probe", lambda *a: (4.9e10, 0.01, 0.6))
    mfu.measured_matmul_peak.cache_clear()
    peak, note = mfu.measured_matmul_peak("cpu")
    assert peak == 4.9e10 and "not kept" in note
    assert note.endswith(f"{tmp_path / 'peak.json'}: not JSON; the matmul peak is measured again (the file is left as it is)")
    assert (tmp_path / "peak.json").read_text() == "{cut short"
    mfu.measured_matmul_peak.cache_clear()
