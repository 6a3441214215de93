"""Multiple-choice tasks scored by likelihood (`llmlab.eval.tasks`, ``llmlab eval tasks=[...]``)."""

from __future__ import annotations

import contextlib
import json
from types import SimpleNamespace

import pytest
import torch

from llmlab.data.tokenizer import TOKENIZER
from llmlab.errors import UserError
from llmlab.eval.tasks import Question, question, read_task, score_task, wilson


def test_every_documented_layout_reads_as_one_question():
    assert question({"ctx": "a", "endings": ["b", "c", "d"], "label": "2"}) == Question("a", ("b", "c", "d"), 2)
    assert question({"ctx_a": "a", "ctx_b": "b", "endings": ["x", "y"], "label": 0}).context == "a b"
    arc = {"question": "q", "choices": {"text": ["x", "y", "z"], "label": ["A", "B", "C"]}, "answerKey": "C"}
    assert question(arc) == Question("q", ("x", "y", "z"), 2)
    assert question({"goal": "g", "sol1": "s", "sol2": "t", "label": 1}) == Question("g", ("s", "t"), 1)
    assert question({"query": "q", "choices": ["x", "y"], "gold": 1}).answer == 1


@pytest.mark.parametrize("record, why", [
    ([1, 2], "a JSON list, not an object"),
    ({"ctx": "a"}, "no choices"),
    ({"ctx": "a", "endings": ["b"], "label": 0}, "the choices are not a list of two or more"),
    ({"ctx": "a", "endings": ["b", "c"], "label": 2}, "the answer 2 is not one of the 2 choices"),
    ({"ctx": "a", "endings": ["b", "c"], "label": True}, "the answer True is not one of the 2 choices"),
    ({"ctx": 3, "endings": ["b", "c"], "label": 0}, "the context is not a string"),
    ({"question": "q", "choices": {"text": ["x", "y"], "label": ["A", "B"]}, "answerKey": "E"}, "the answer 'E'"),
])
def test_a_line_that_fits_no_layout_says_why(record, why):
    with pytest.raises(ValueError, match=why):
        question(record)


def test_a_malformed_file_is_one_line_naming_the_file_and_the_line(tmp_path):
    f = tmp_path / "task.jsonl"
    f.write_text(json.dumps({"ctx": "a", "endings": ["b", "c"], "label": 0}) + "\n\n{not json\n")
    with pytest.raises(UserError, match=rf"^tasks: {f}, line 3: "):
        read_task(f)
    with pytest.raises(UserError, match=r"^tasks: .*nope.jsonl does not exist$"):
        read_task(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(UserError, match="holds no question"):
        read_task(tmp_path / "empty.jsonl")


QUESTIONS = [{"ctx": "def f(x):", "endings": [" return x", " pass", " yield"], "label": 0},
             {"question": "import", "choices": {"text": [" os", " sys"], "label": ["A", "B"]}, "answerKey": "B"},
             {"goal": "for i in", "sol1": " range(3):", "sol2": " nothing", "label": 0}]


@pytest.mark.parametrize("form", ["parquet", "csv-less json", "saved dataset"])
def test_a_datasets_source_reads_as_the_same_questions_as_its_jsonl(tmp_path, form):
    import datasets

    lines = tmp_path / "task.jsonl"
    lines.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS[:1]) * 3)
    rows = datasets.Dataset.from_list([QUESTIONS[0]] * 3)
    if form == "parquet":
        source = tmp_path / "task.parquet"
        rows.to_parquet(str(source))
    elif form == "saved dataset":
        source = tmp_path / "saved"
        datasets.DatasetDict({"validation": rows}).save_to_disk(str(source))
    else:
        source = tmp_path / "task.json"
        rows.to_json(str(source))
    assert read_task(source) == read_task(lines) and len(read_task(source)) == 3


def test_a_datasets_row_that_fits_no_layout_names_the_source_and_row(tmp_path):
    import datasets

    source = tmp_path / "task.parquet"
    datasets.Dataset.from_list([QUESTIONS[0], {**QUESTIONS[0], "label": 7}]).to_parquet(str(source))
    with pytest.raises(UserError, match=rf"^tasks: {source}, row 2: the answer 7 is not one of the 3 choices$"):
        read_task(source)
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(UserError, match=r"^tasks: cannot load .*bad.parquet \("):
        read_task(tmp_path / "bad.parquet")
    with pytest.raises(UserError, match=r"^tasks: .*gone.parquet does not exist$"):
        read_task(tmp_path / "gone.parquet")


def test_the_wilson_interval():
    lo, hi = wilson(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    assert wilson(10, 10)[1] == pytest.approx(1.0) and wilson(0, 10)[0] == pytest.approx(0.0, abs=1e-12)


class Fond:
    """A stand-in model that likes one byte: its logits favour ``liked`` wherever it looks."""

    max_seq_len, vocab_size = 64, 257

    def __init__(self, liked: str):
        self.liked = ord(liked)

    def __call__(self, x):
        logits = torch.zeros(*x.shape, self.vocab_size)
        logits[..., self.liked] = 10.0
        return SimpleNamespace(logits=logits)


def test_accuracy_on_a_task_whose_answers_are_known():
    byte = TOKENIZER.build(TOKENIZER.config({"kind": "byte"}, "tokenizer")).make()
    right = Question("pick", ("rrr", "xyz"), 0)
    wrong = Question("pick", ("rrr", "xyz"), 1)  # the model prefers rrr; the key says xyz
    # summed, the short choice loses least (one unliked space); per byte, the long one, whose
    # nine liked bytes spread its two unliked ones thin
    short = Question("pick", ("r", "rrrrrrrrrx"), 1)
    scored = score_task(Fond("r"), byte, [right, right, right, wrong, short], torch.device("cpu"), contextlib.nullcontext())
    assert scored["n"] == 5 and scored["acc"] == pytest.approx(3 / 5) and scored["acc_norm"] == pytest.approx(4 / 5)
    assert scored["chance"] == pytest.approx(0.5) and scored["acc_ci95"] == pytest.approx(wilson(3, 5))


def test_eval_scores_a_task_file_into_eval_json(corpus_dir, tmp_path):
    from llmlab.train.loop import run_training
    from tests.conftest import run_cli
    from tests.helpers import config

    run_training(config(corpus_dir, tmp_path, steps=4, eval_every=0), tmp_path / "run")
    task = tmp_path / "arc.jsonl"
    task.write_text("\n".join(json.dumps({"question": f"x = {i} +", "choices": {"text": [" 1", " y"], "label": ["A", "B"]},
                                          "answerKey": "A"}) for i in range(6)) + "\n")
    done = run_cli("eval", f"ckpt={tmp_path / 'run'}", f"tasks=[{task}]", f"text={tmp_path / 'mixed.txt'}",
                   f"hydra.run.dir={tmp_path / 'ev'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    scored = json.loads((tmp_path / "ev" / "eval.json").read_text())["tasks"]["arc"]
    hits = round(scored["acc"] * 6)
    assert scored["n"] == 6 and scored["acc"] == hits / 6 and scored["acc_ci95"] == pytest.approx(list(wilson(hits, 6)))
    assert "tasks: accuracy by likelihood" in done.stdout
    task.write_text(task.read_text() + '{"question": "q", "choices": ["a"], "answerKey": "A"}\n')
    done = run_cli("eval", f"ckpt={tmp_path / 'run'}", f"tasks=[{task}]", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip() == (f"llmlab: error: tasks: {task}, line 7: the choices are not a list of two or more")


def test_a_run_scores_its_tasks_at_each_evaluation_and_a_bad_file_stops_it_before_any_work(corpus_dir, tmp_path):
    from llmlab.train.loop import run_training
    from tests.helpers import config

    task = tmp_path / "piqa.jsonl"
    task.write_text("\n".join(json.dumps({"goal": f"x{i}", "sol1": " = 1", "sol2": " qq", "label": i % 2})
                              for i in range(4)) + "\n")
    run_training(config(corpus_dir, tmp_path, steps=6, eval_every=3, eval_tasks=[str(task)]), tmp_path / "run")
    evals = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if "val/loss" in line]
    assert [e["step"] for e in evals] == [3, 6]
    assert all(e["val/task/piqa/acc"] in (0, 0.25, 0.5, 0.75, 1) and "val/task/piqa/acc_norm" in e for e in evals)
    task.write_text('{"goal": "x", "sol1": "a"}\n')
    with pytest.raises(UserError, match=rf"^train.eval_tasks: {task}, line 1: "):
        from llmlab.train.settings import check_train_config
        check_train_config(config(corpus_dir, tmp_path, eval_tasks=[str(task)]))
