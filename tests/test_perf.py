"""Speed figures carry their uncertainty: the other load read from /proc/stat, medians and
spreads of repeated timings, and the marks they earn."""

import pytest

from llmlab import perf

STAT = """cpu  {user} 0 {system} {idle} 0 0 0 {steal} 0 0
cpu0 1 0 1 1 0 0 0 0 0 0
cpu1 1 0 1 1 0 0 0 0 0 0
intr 12345
ctxt 6789
"""


def stat(user, system=0, idle=0, steal=0):
    return STAT.format(user=user, system=system, idle=idle, steal=steal)


def test_proc_stat_counts_busy_time_over_all_cpus_and_the_cpus():
    busy, cpus = perf.parse_proc_stat(stat(user=300, system=100, idle=5000, steal=50), ticks_per_s=100)
    assert cpus == 2 and busy == pytest.approx(4.5)  # (300 + 100 + 50) ticks; idle is not busy
    with pytest.raises(ValueError, match="/proc/stat"):
        perf.parse_proc_stat("MemTotal: 1 kB\n", 100)


def test_proc_stat_counts_only_the_cpus_asked_for_from_their_own_lines():
    text = "cpu  900 0 300 0 0 0 0 0\ncpu0 100 0 100 0 0 0 0 0\ncpu1 800 0 200 0 0 0 0 0\ncpu2 0 0 0 50 0 0 0 0\n"
    assert perf.parse_proc_stat(text, 100) == (pytest.approx(12.0), 3)
    assert perf.parse_proc_stat(text, 100, only={1, 2}) == (pytest.approx(10.0), 2)  # cpu1 and cpu2
    with pytest.raises(ValueError, match="/proc/stat"):
        perf.parse_proc_stat(text, 100, only={7})  # none of them


def test_other_load_is_what_others_used_of_the_whole_machine():
    # 10 s on 2 CPUs = 20 CPU-seconds; everyone used 16, this process 6: others used half
    a = perf.CpuSnapshot(wall=100.0, busy=50.0, own=3.0, cpus=2)
    b = perf.CpuSnapshot(wall=110.0, busy=66.0, own=9.0, cpus=2)
    assert perf.other_load(a, b) == pytest.approx(0.5)
    assert perf.contended(perf.other_load(a, b))
    quiet = perf.CpuSnapshot(wall=110.0, busy=57.5, own=9.0, cpus=2)  # others 1.5 of 20 CPU-seconds
    assert perf.other_load(a, quiet) == pytest.approx(0.075) and not perf.contended(0.075)
    assert perf.other_load(a, perf.CpuSnapshot(110.0, None, 9.0, 2)) is None  # no /proc/stat: unknown
    assert not perf.contended(None)


def test_snapshot_reads_a_stat_file_and_survives_its_absence(tmp_path):
    f = tmp_path / "stat"
    f.write_text(stat(user=1000))
    s = perf.snapshot(f)
    assert s.cpus == 2 and s.busy is not None and s.busy > 0
    missing = perf.snapshot(tmp_path / "nope")
    assert missing.busy is None and missing.cpus >= 1


def test_a_rate_is_a_median_with_a_spread_and_says_when_it_was_contended():
    r = perf.rate([100.0, 90.0, 110.0, 100.0, 1000.0], load=0.4)  # one outlier barely moves it
    assert r.median == 100.0 and r.n == 5 and r.spread == pytest.approx(0.05)
    text = perf.describe(r)
    assert text.startswith("100 tok/s ±5%") and "contended: other work used 40% of the CPU" in text
    clean = perf.rate([100.0, 102.0], load=0.01)
    assert clean.spread == 0.0 and perf.describe(clean) == "101 tok/s"  # too few timings for a spread
    assert clean.as_dict("tokens_per_s") == {"tokens_per_s": 101.0, "tokens_per_s_spread": 0.0,
                                              "tokens_per_s_n": 2, "tokens_per_s_other_load": 0.01}
