"""``threads=auto``: each decoding step on the CPU runs on the cores that other processes
left (`llmlab.sample.threads`). The load is fed from a simulated machine, so that "idle" and
"busy" are exact; the real decoding is checked for its tokens and for putting the count back."""

import pytest
import torch

from llmlab.perf import CpuSnapshot
from llmlab.sample.settings import SamplingConfig, check_threads
from llmlab.sample.threads import INTERVAL, ThreadPicker, cores_left


def test_the_count_is_the_share_of_cores_left_rounded_at_least_one():
    assert [cores_left(2, load) for load in (0.0, 0.2, 0.3, 0.5, 1.0)] == [2, 2, 1, 1, 1]
    assert [cores_left(8, load) for load in (0.0, 0.3, 0.5, 0.9, 1.0)] == [8, 6, 4, 1, 1]


class Machine:
    """Two CPUs; other processes use ``others`` of them (0 to 1) while each step takes ``step`` s."""

    def __init__(self, others: float = 0.0, step: float = 0.01, known: bool = True):
        self.wall, self.busy, self.own = 100.0, 500.0, 5.0
        self.others, self.step, self.known = others, step, known

    def clock(self) -> float:
        return self.wall

    def read(self) -> CpuSnapshot:
        return CpuSnapshot(self.wall, self.busy if self.known else None, self.own, 2)

    def advance(self) -> None:
        threads = torch.get_num_threads()
        self.wall += self.step
        self.own += threads * self.step
        self.busy += threads * self.step + 2 * self.others * self.step


def decode(picker: ThreadPicker, machine: Machine, steps: int) -> list[int]:
    counts = []
    for _ in range(steps):
        picker.before()
        counts.append(torch.get_num_threads())
        machine.advance()
    return counts


def test_the_steps_run_on_the_cores_other_processes_left_as_the_load_comes_and_goes():
    found = torch.get_num_threads()
    machine = Machine(others=0.0)
    picker = ThreadPicker(2, read=machine.read, clock=machine.clock)
    per_interval = round(INTERVAL / machine.step)
    try:
        assert set(decode(picker, machine, 3 * per_interval)) == {2}  # idle: every step on both
        assert picker.said() == "2 threads"
        machine.others = 0.95  # a training starts beside: from the next reading on, one thread
        counts = decode(picker, machine, 3 * per_interval)
        assert set(counts[per_interval + 1:]) == {1} and counts.index(1) <= per_interval + 1
        machine.others = 0.0  # it ends: back to both within a reading
        counts = decode(picker, machine, 3 * per_interval)
        assert set(counts[per_interval + 1:]) == {2}
        assert sum(picker.steps.values()) == 9 * per_interval and picker.steps[1] >= 2 * per_interval - 2
        assert picker.said().startswith(f"2 threads for {picker.steps[2]} of {9 * per_interval} steps, "
                                        f"1 for {picker.steps[1]} (other processes used up to ")
        assert picker.busiest > 0.9
    finally:
        picker.restore()
    assert torch.get_num_threads() == found


def test_a_moment_of_load_is_averaged_over_a_reading_and_no_reading_keeps_all_threads():
    machine = Machine(others=0.0)
    picker = ThreadPicker(2, read=machine.read, clock=machine.clock)
    per_interval = round(INTERVAL / machine.step)
    try:
        decode(picker, machine, per_interval + 1)
        machine.others = 1.0
        assert set(decode(picker, machine, per_interval // 10)) == {2}  # a tenth of a reading at full load
        machine.others = 0.0
        assert set(decode(picker, machine, 3 * per_interval)) == {2}
        unknown = Machine(others=1.0, known=False)  # no /proc/stat (not Linux): nothing to read
        blind = ThreadPicker(2, read=unknown.read, clock=unknown.clock)
        assert set(decode(blind, unknown, 3 * per_interval)) == {2} and blind.busiest is None
    finally:
        picker.restore()


def test_no_picker_where_nothing_is_chosen():
    found = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert ThreadPicker.for_decoding(torch.device("cpu")) is not None
        assert ThreadPicker.for_decoding(torch.device("cpu"), 2) is None  # threads=N: set for the command
        assert ThreadPicker.for_decoding(torch.device("meta")) is None
        torch.set_num_threads(1)
        assert ThreadPicker.for_decoding(torch.device("cpu")) is None
    finally:
        torch.set_num_threads(found)


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "many", None])
def test_a_bad_thread_count_names_the_key(value):
    from llmlab.errors import ConfigError
    with pytest.raises(ConfigError, match=r"^threads: must be auto or a whole number of threads, at least 1"):
        check_threads(value)


def test_decoding_while_the_count_changes_gives_the_same_tokens_and_puts_the_count_back():
    """The load swings at every reading, so the steps alternate between 2 threads and 1: the
    tokens are those of a fixed count, the prompt and every one-token step go through the
    picker, and the process's count is the same afterwards."""
    from llmlab.sample.generate import generate
    from tests.conftest import tiny_model

    found = torch.get_num_threads()
    model = tiny_model(max_seq_len=64)
    prompt = torch.tensor([[5, 7, 11], [3, 2, 1]])
    cfg = SamplingConfig(max_new_tokens=40, temperature=0)
    fixed = generate(model, prompt, cfg, pack=False)
    machine = Machine(step=INTERVAL)

    def swinging():
        machine.advance()
        machine.others = 0.9 - machine.others  # 0.9, 0, 0.9, ...: the next reading sees it
        return machine.read()

    picker = ThreadPicker(2, read=swinging, clock=lambda: machine.wall + INTERVAL)
    picked = generate(model, prompt, cfg, pack=False, threads=picker)
    assert torch.equal(picked, fixed)
    assert torch.get_num_threads() == found
    assert sum(picker.steps.values()) == 39 and picker.steps[1] >= 15 and picker.steps[2] >= 15
