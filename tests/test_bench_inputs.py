"""The benchmarks read files a person may have edited: each mistake stops with one line that
names the file and the entry, before any run starts."""

import json

import pytest

from bench.isoflop import read_grids


def test_a_grids_file_is_keyed_as_the_study_asks(tmp_path):
    path = tmp_path / "grids.json"
    path.write_text(json.dumps({"mha": {"5e+11": [32, 48], "1000000000000": [40, 64], "2e12": [8]}, "gqa": {}}))
    assert read_grids(path, ["mha"], [5e11, 1e12]) == {"mha": {"5e+11": [32, 48], "1e+12": [40, 64]}}


@pytest.mark.parametrize("text, names", [
    ("{not json", "file"),
    ("[1, 2]", "JSON object"),
    ('{"mla": {"5e11": [32]}}', "variant 'mha'"),
    ('{"mha": [32]}', "variant 'mha'"),
    ('{"mha": {"five": [32]}}', "budget 'five'"),
    ('{"mha": {"1e12": [32]}}', "budget 5e+11"),
    ('{"mha": {"5e11": []}}', "budget 5e+11"),
    ('{"mha": {"5e11": [32, "48"]}}', "budget 5e+11"),
    ('{"mha": {"5e11": [32, true]}}', "budget 5e+11"),
    ('{"mha": {"5e11": [0]}}', "budget 5e+11"),
])
def test_a_hand_edited_grids_file_stops_with_one_line(tmp_path, text, names):
    path = tmp_path / "grids.json"
    path.write_text(text)
    with pytest.raises(SystemExit) as stop:
        read_grids(path, ["mha"], [5e11])
    message = str(stop.value)
    assert message.startswith(f"bench.isoflop: {path}: ") and "\n" not in message
    assert names in message


def test_a_budget_given_twice_stops_the_study_before_any_run(monkeypatch, tmp_path):
    # two processes of one sweep would share its run directory; the second is refused by its lock
    from bench import isoflop

    monkeypatch.setattr(isoflop, "run", lambda *a, **k: pytest.fail("a run started"))
    monkeypatch.setattr("sys.argv", ["isoflop", "--budgets", "3e13,1.2e14,1.2e+14", "--work", str(tmp_path)])
    with pytest.raises(SystemExit, match=r"^bench.isoflop: --budgets: 1.2e\+14 is given twice$"):
        isoflop.main()


def test_a_negative_recentre_stops_the_study_before_any_run(monkeypatch, tmp_path):
    from bench import isoflop

    monkeypatch.setattr(isoflop, "run", lambda *a, **k: pytest.fail("a run started"))
    monkeypatch.setattr("sys.argv", ["isoflop", "--recentre", "-1", "--work", str(tmp_path)])
    with pytest.raises(SystemExit, match=r"^bench.isoflop: --recentre: -1 rounds; allowed: 0 \(none\) or more$"):
        isoflop.main()


def test_a_study_over_some_budgets_keeps_the_work_directorys_other_sizes(tmp_path, capsys):
    # `--grids W/grids.json --budgets <some>` over a work directory: the other budgets stay recorded
    from bench.isoflop import save_grids

    path = tmp_path / "grids.json"
    path.write_text(json.dumps({"mha": {"5e+11": [16, 32], "1e+12": [24, 32]}, "mla": {"1e+12": [40]}}))
    save_grids(path, {"mha": {"5e+11": [16, 32, 48]}})
    assert json.loads(path.read_text()) == {"mha": {"5e+11": [16, 32, 48], "1e+12": [24, 32]}, "mla": {"1e+12": [40]}}
    assert capsys.readouterr().out == ""
    path.write_text("[1, 2")  # a damaged record is replaced, and said so
    save_grids(path, {"mha": {"5e+11": [8]}})
    assert json.loads(path.read_text()) == {"mha": {"5e+11": [8]}}
    assert capsys.readouterr().out == f"bench.isoflop: {path}: not a JSON object of sizes; replaced by this study's\n"


@pytest.mark.parametrize("given, names", [
    (["--lr", "8e-3,abc"], "--lr: 'abc' is not a learning rate; allowed: positive numbers, comma-separated"),
    (["--lr", "8e-3,0"], "--lr: '0' is not a learning rate; allowed: positive numbers, comma-separated"),
    (["--lr", "8e-3,nan"], "--lr: 'nan' is not a learning rate"),
    (["--lr", "8e-3,1.6e-2,8e-3"], "--lr: 8e-3 is given twice"),
    (["--lr", "8e-3,1.6e-2", "--set", "optim.lr=1e-3"], "--set optim.lr: the learning rates are --lr's"),
    (["--plan-sizes", "8,16", "--plan-budgets", "2e9,8e9"],  # a planning round too small to fit
     "--plan-sizes 8,16 --plan-budgets 2e9,8e9: too few runs for the planning fit (it needs 2 sizes, 2 budgets and 5 "
     "runs); allowed: 3 sizes or more and 2 budgets or more, or --grids"),
])
def test_a_mistyped_setting_stops_the_study_before_any_run(monkeypatch, tmp_path, given, names):
    from bench import isoflop

    monkeypatch.setattr(isoflop, "run", lambda *a, **k: pytest.fail("a run started"))
    monkeypatch.setattr("sys.argv", ["isoflop", *given, "--work", str(tmp_path)])
    with pytest.raises(SystemExit) as stop:
        isoflop.main()
    assert str(stop.value).startswith(f"bench.isoflop: {names}") and "\n" not in str(stop.value)


@pytest.mark.parametrize("rates, dirs, lrs, select", [
    (None, ["mha-1e+11-d16-seed0"], ["optim.lr=8e-3"], False),
    ("1e-2", ["mha-1e+11-d16-seed0"], ["optim.lr=1e-2"], False),
    ("8e-3,1.6e-2", ["mha-1e+11-d16-seed0-lr1.6e-2", "mha-1e+11-d16-seed0-lr8e-3"], ["optim.lr=1.6e-2", "optim.lr=8e-3"],
     True),
])
def test_a_study_runs_each_cell_at_each_learning_rate_and_keeps_its_best(monkeypatch, tmp_path, rates, dirs, lrs, select):
    from bench import isoflop

    ran = []

    def fake_run(words, cwd, env):
        ran.append(words)
        for w in words:
            if w.startswith("hydra.sweep.dir="):
                (cwd / w.split("=", 1)[1]).mkdir(parents=True)
            if w.startswith("out="):
                (tmp_path / "results" / "isoflop").mkdir(parents=True, exist_ok=True)
                (tmp_path / "results" / "isoflop" / "report.json").write_text("{}")
                (tmp_path / "results" / "isoflop" / "report.md").write_text("")
        return 0.0

    monkeypatch.setattr(isoflop, "run", fake_run)
    monkeypatch.setattr(isoflop, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(isoflop, "write_result", lambda name, data: None)
    grids = tmp_path / "grids.json"
    grids.write_text(json.dumps({"mha": {"1e11": [16]}}))
    monkeypatch.setattr("sys.argv", ["isoflop", "--variants", "mha", "--budgets", "1e11", "--seeds", "0", "--grids",
                                     str(grids), "--work", str(tmp_path / "work"), *(["--lr", rates] if rates else [])])
    isoflop.main()
    trains = [w for w in ran if w[0] == "train"]
    assert sorted(w[-1] for w in trains) == [f"hydra.sweep.dir=study/{d}" for d in dirs]
    assert sorted(x for w in trains for x in w if x.startswith("optim.lr=")) == lrs  # one rate a run
    (report,) = [w for w in ran if w[0] == "report"]
    assert sorted(w for w in report if w.startswith("study/")) == [f"study/{d}" for d in dirs]
    assert ("select=best_lr" in report) == select


@pytest.mark.parametrize("jobs, cores, given, threads", [(16, 16, None, "1"), (2, 16, None, "8"), (1, 2, None, "2"),
                                                       (4, 2, None, "1"), (16, 16, "3", "3")])
def test_each_job_of_a_study_gets_its_share_of_the_cores(monkeypatch, tmp_path, jobs, cores, given, threads):
    from bench import isoflop

    def first_run(words, cwd, env):  # the data's tokenize run, before any training
        raise SystemExit(env["OMP_NUM_THREADS"])

    monkeypatch.setattr(isoflop, "run", first_run)
    monkeypatch.setattr(isoflop.os, "cpu_count", lambda: cores)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    if given:
        monkeypatch.setenv("OMP_NUM_THREADS", given)
    monkeypatch.setattr("sys.argv", ["isoflop", "--jobs", str(jobs), "--work", str(tmp_path)])
    with pytest.raises(SystemExit) as ran:
        isoflop.main()
    assert str(ran.value) == threads


def test_a_mistyped_recipe_stops_train_default_before_the_data_is_prepared(monkeypatch, capfd):
    """`bench.train_default` checks both recipes' settings (`llmlab train --cfg job`, a second)
    before it tokenizes anything: a typo in the reference stops it in one line that names the
    command, and no tokenize or training ran."""
    from bench import train_default

    ran = []
    real = train_default.llmlab

    def recorded(words, *args, **kwargs):
        ran.append(words[0] if words[1:2] != ["--cfg"] else "check")
        return real(words, *args, **kwargs)

    monkeypatch.setattr(train_default, "llmlab", recorded)
    monkeypatch.setattr("sys.argv", ["bench.train_default", "--overrides", "train.steps=2",
                                     "--reference", "optim.lrr=1"])
    with pytest.raises(SystemExit) as stop:
        train_default.main()
    assert str(stop.value) == "bench.train_default: llmlab train --cfg job logger=none optim.lrr=1 failed (exit 2)"
    assert ran == ["check", "check"]  # the first recipe passed its check; nothing ran after the second's
    assert "llmlab: error: optim.lrr: unknown key" in capfd.readouterr().err


def test_train_defaults_seed_pairs_give_the_mean_difference_with_its_t_interval():
    """`bench.train_default --seeds`: per recipe the seeds' bits per byte, and the paired
    difference's mean with a 95% t-interval (t(0.975, 2) = 4.303 for three seeds)."""
    from bench.train_default import over_seeds

    pairs = [{"default": {"val_bpb_full": 1.0 + d, "train_elapsed_s": t}, "reference": {"val_bpb_full": 1.0, "train_elapsed_s": 200.0},
              "train_time_vs_reference": t / 200.0, "bpb_vs_reference": d}
             for d, t in ((0.001, 100.0), (0.003, 90.0), (0.002, 120.0))]
    out = over_seeds(pairs)
    assert out["default"]["bpb_mean"] == pytest.approx(1.002) and out["default"]["bpb_max"] == pytest.approx(1.003)
    assert out["train_time_vs_reference_median"] == pytest.approx(0.5)
    assert out["bpb_vs_reference_mean"] == pytest.approx(0.002)
    half = 4.302653 * 0.001 / 3 ** 0.5
    assert out["bpb_vs_reference_95ci"] == pytest.approx([0.002 - half, 0.002 + half], rel=1e-5)


def test_recentre_adds_one_size_past_the_end_nearer_an_off_centre_optimum():
    """The study's re-centring round (what its report flags off-centre gets one more size, on
    the optimum's side), on a report's scaling section as `llmlab report` writes it."""
    from bench.isoflop import recentre

    mla = "attention.kv_rank=d_model/2 attention.nope_dim=d_model/4 attention.rope_dim=d_model/4 " \
          "attention.v_dim=d_model/4 model/attention=mla"

    def budget(b, position, iso_position=0.5, flagged=True, best_at_end=None):
        return {"budget": b, "optimum_position": position, "isoflop": {"position": iso_position},
                "isoflop_off_centre": flagged, "best_at_end": best_at_end}

    section = {"variants": {
        "model/attention=mha": {"per_budget": [budget(5e10, -0.2), budget(1e11, 0.5, flagged=False),
                                               budget(2e11, 0.5, iso_position=0.1)]},
        mla: {"per_budget": [budget(5e10, 0.4, best_at_end="largest"), budget(2e11, 0.85), budget(5e11, 0.1),
                             budget(1e12, 0.9, best_at_end="smallest")]},  # the best size run wins over the fit
        "model/attention=gqa": {"per_budget": [budget(5e10, 0.9)]},  # not a variant of this study
    }}
    grids = {"mha": {"5e+10": [16, 32, 48], "1e+11": [8, 16, 40], "2e+11": [8, 24, 40]},
             "mla": {"5e+10": [8, 16, 24], "2e+11": [8, 16, 24], "5e+11": [8, 16, 24], "1e+12": [16, 24, 32]}}
    more = recentre(section, grids, ["mha", "mla"], 8)
    assert [(m["variant"], m["budget"], m["d_model"]) for m in more] == [
        ("mha", 5e10, 8), ("mha", 2e11, None), ("mla", 5e10, 32), ("mla", 2e11, 32), ("mla", 5e11, None),
        ("mla", 1e12, 8)]
    assert "no size below 8 is a multiple of 8" in more[1]["why"] and "adding d_model 32" in more[3]["why"]
    assert more[2]["why"].startswith("the best size run is the grid [8, 16, 24]'s largest")
    assert recentre(None, grids, ["mha"], 8) == [] and recentre({"variants": {}}, grids, ["mha"], 8) == []
