"""Multiple-choice tasks scored by likelihood (``llmlab eval tasks=[file.jsonl,...]``).

Each line of a task file is one question: a context and its choices, one of them right. The
model scores each choice by the log-likelihood of its tokens after the context's; the answer
is the choice scored highest (``acc``), or highest per byte of the choice (``acc_norm``, which
does not favour short choices). Accuracy comes with its 95% Wilson interval.

The fields accepted (one line, one JSON object):

- HellaSwag: ``ctx`` (or ``ctx_a`` and ``ctx_b``), ``endings`` (a list), ``label`` (the right
  ending's index, a number or a string of one);
- ARC: ``question``, ``choices`` as ``{"text": [...], "label": ["A", "B", ...]}`` and
  ``answerKey`` (one of those labels);
- PIQA: ``goal``, ``sol1``, ``sol2`` and ``label`` (0 or 1);
- any of these with ``choices`` as a plain list and ``label`` or ``gold`` as its index.

A line that fits none of them, or is not JSON, is one error naming the file and the line.

A task may also be any `datasets` source whose rows have those fields: a local ``.parquet``,
``.csv`` or ``.json`` file, a directory that ``Dataset.save_to_disk`` wrote, or
``hf:<name>[:<config>][@<split>]`` for the hub (``hf:Rowan/hellaswag@validation``; the split
defaults to validation). A row that fits no layout is one error naming the source and the row.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from llmlab.errors import UserError

Z95 = 1.959964


@dataclass(frozen=True)
class Question:
    context: str
    choices: tuple[str, ...]
    answer: int


def _text(value, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} is not a string")
    return value


def question(record) -> Question:
    """One task line's question, whichever of the accepted layouts it has; a ValueError says
    what is missing or wrong."""
    if not isinstance(record, dict):
        raise ValueError(f"a JSON {type(record).__name__}, not an object")
    if "endings" in record:  # HellaSwag
        context = record["ctx"] if "ctx" in record else f"{record.get('ctx_a', '')} {record.get('ctx_b', '')}".strip()
        choices, label = record["endings"], record.get("label")
    elif "sol1" in record:  # PIQA
        context, choices, label = record.get("goal"), [record.get("sol1"), record.get("sol2")], record.get("label")
    elif "choices" in record:  # ARC, or a plain list
        context = record.get("question", record.get("query", record.get("ctx")))
        choices, label = record["choices"], record.get("answerKey", record.get("label", record.get("gold")))
        if isinstance(choices, dict):
            labels = choices.get("label")
            choices = choices.get("text")
            if isinstance(labels, list) and label in labels:
                label = labels.index(label)
    else:
        raise ValueError("no choices: expected endings (HellaSwag), sol1/sol2 (PIQA) or choices (ARC)")
    if not isinstance(choices, list) or len(choices) < 2:
        raise ValueError("the choices are not a list of two or more")
    choices = tuple(_text(c, "a choice") for c in choices)
    context = _text(context, "the context")
    if isinstance(label, str) and label.strip().isdigit():
        label = int(label)
    if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < len(choices):
        raise ValueError(f"the answer {label!r} is not one of the {len(choices)} choices")
    return Question(context, choices, label)


DATASET_SUFFIXES = {".parquet": "parquet", ".csv": "csv", ".json": "json"}  # datasets' builders for local files
HUB = "hf:"


def is_dataset_source(spec: str) -> bool:
    path = Path(spec).expanduser()
    return (spec.startswith(HUB) or path.suffix in DATASET_SUFFIXES
            or (path.is_dir() and any((path / f).is_file() for f in ("dataset_info.json", "dataset_dict.json"))))


def _dataset_rows(spec: str, key: str):
    """The rows of a `datasets` source (see the module's docstring)."""
    import datasets

    path = Path(spec).expanduser()
    try:
        if spec.startswith(HUB):
            name, _, split = spec[len(HUB):].partition("@")
            name, _, config = name.partition(":")
            if not name:
                raise UserError(f"{key}: {spec} names no dataset; write hf:<name>[:<config>][@<split>]")
            ds = datasets.load_dataset(name, config or None, split=split or "validation")
        elif path.is_dir():
            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                split = "validation" if "validation" in ds else next(iter(ds))
                ds = ds[split]
        else:
            if not path.is_file():
                raise UserError(f"{key}: {path} does not exist")
            if path.stat().st_size == 0:
                raise UserError(f"{key}: {path} holds no question")
            ds = datasets.load_dataset(DATASET_SUFFIXES[path.suffix], data_files=str(path), split="train")
    except UserError:
        raise
    except Exception as e:  # the library's own exception types, for a malformed file or an unknown name
        cause = e.__cause__ or e
        reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:160]
        raise UserError(f"{key}: cannot load {spec} ({reason})") from None
    return ds


def read_task(path: str | Path, key: str = "tasks") -> list[Question]:
    """Every question of a task file or `datasets` source; one line names the setting
    (``key``), the source and the line or row that is wrong."""
    if is_dataset_source(str(path)):
        return _questions(enumerate(_dataset_rows(str(path), key), start=1), f"{key}: {path}", "row")
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{key}: {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{key}: {path} cannot be read as text ({type(e).__name__})") from None
    lines = ((n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip())
    return _questions(lines, f"{key}: {path}", "line", parse=json.loads)


def _questions(records, where: str, unit: str, parse=lambda record: record) -> list[Question]:
    """The questions of numbered records (each read by ``parse``); the first that fits no
    layout is one line naming ``where`` and its ``unit`` (line or row) number."""
    out = []
    for n, record in records:
        try:
            out.append(question(parse(record)))
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            reason = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
            raise UserError(f"{where}, {unit} {n}: {reason}") from None
    if not out:
        raise UserError(f"{where} holds no question")
    return out


def wilson(hits: int, n: int) -> tuple[float, float]:
    """The 95% Wilson interval of a proportion of ``hits`` in ``n``."""
    p = hits / n
    centre = (p + Z95 ** 2 / (2 * n)) / (1 + Z95 ** 2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95 ** 2 / (4 * n * n)) / (1 + Z95 ** 2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@torch.no_grad()
def choice_scores(model, tokenizer, q: Question, device: torch.device, amp) -> list[float]:
    """The log-likelihood of each choice's tokens after the context's (the context cut from
    its start where the two do not fit the model's window). Context and choice are encoded
    apart, so a choice's tokens are the same whatever context it follows."""
    context = tokenizer.encode(q.context)
    scores = []
    for choice in q.choices:
        # a choice follows its context after a space, unless either side already has one
        apart = q.context and not q.context[-1].isspace() and not choice[:1].isspace()
        ending = tokenizer.encode((" " if apart else "") + choice)
        ids = (context + ending)[-(model.max_seq_len + 1):]
        n = min(len(ending), len(ids) - 1)
        if n <= 0:
            scores.append(-math.inf)
            continue
        x = torch.tensor([ids[:-1]], device=device)
        with amp:
            logits = model(x).logits[0, -n:].float()
        target = torch.tensor(ids[-n:], device=device)
        scores.append(float(-F.cross_entropy(logits[:, :model.vocab_size], target, reduction="sum")))
    return scores


def score_task(model, tokenizer, questions: list[Question], device: torch.device, amp) -> dict:
    """``acc`` and ``acc_norm`` (per byte of the choice) with their 95% Wilson intervals."""
    hits = hits_norm = 0
    for q in questions:
        scores = choice_scores(model, tokenizer, q, device, amp)
        per_byte = [s / max(1, len(c.encode("utf-8"))) for s, c in zip(scores, q.choices)]
        hits += max(range(len(scores)), key=scores.__getitem__) == q.answer
        hits_norm += max(range(len(per_byte)), key=per_byte.__getitem__) == q.answer
    n = len(questions)
    chance = sum(1 / len(q.choices) for q in questions) / n
    return {"n": n, "acc": hits / n, "acc_ci95": wilson(hits, n), "acc_norm": hits_norm / n,
            "acc_norm_ci95": wilson(hits_norm, n), "chance": chance}


def task_files(paths: list[str], key: str = "tasks") -> dict[str, list[Question]]:
    """Each task file's questions by the file's name (its path where two files share a name)."""
    out: dict[str, list[Question]] = {}
    for p in paths:
        name = p[len(HUB):].partition("@")[0].replace("/", "_") if p.startswith(HUB) else Path(p).stem
        out[name if name not in out else p] = read_task(p, key)
    return out

