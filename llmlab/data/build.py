"""Building a cache entry, streamed: the corpus is read once for a tokenizer sample and once
per split for encoding, a batch of about `BATCH_CHARS` at a time, so memory is bounded by the
settings (batch size, workers, the tokenizer's sample), not by the corpus.

The entry is built in ``<cache>/.partial-<key>/``, which survives a kill: ``progress.json``
records the trained tokenizer and each finished shard with how far into its split's stream it
reaches, so the next run continues after the last finished shard. A shard is written under a
temporary name and renamed when whole, and one builder at a time holds the directory's lock.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from llmlab import console
from llmlab.data.corpus import SPLITS, Corpus
from llmlab.data.documents import Document, pieces
from llmlab.data.encode import encode_batches
from llmlab.data.shards import SplitWriter, shard_name, token_dtype
from llmlab.data.tokenizer import TextTokenizer
from llmlab.data.train_tokenizer import train_tokenizer
from llmlab.errors import UserError
from llmlab.files import atomic_write_text, open_append
from llmlab.perf import is_count, is_seconds

BATCH_CHARS = 1 << 20  # text per encoding batch
SMALL_SPLIT = 16 << 20  # bytes below which the default encodes in this process (workers cost a start)
LOG_EVERY_S = 10.0  # a progress line this often when stderr is not a terminal


@dataclass
class Batch:
    texts: list[str] = field(default_factory=list)
    ends: list[bool] = field(default_factory=list)  # the separator follows this text
    chars: int = 0
    nbytes: int = 0
    docs: int = 0
    position: int = 0  # stream items (documents or parts) consumed up to the end of this batch
    open_text: bool = False  # text since the last separator, at the end of this batch (a resume needs it)
    repaired: int = 0  # byte sequences that were not UTF-8 (read as U+FFFD)
    repaired_names: list[str] = field(default_factory=list)  # the documents they were in


def batches(items: Iterator[Document], separator: str | None, position: int = 0,
            batch_chars: int | None = None, open_text: bool = False) -> Iterator[Batch]:
    """Encoding batches of ``items``: each document's text in pieces, the separator after the
    end of each document and at each literal separator inside one (as
    `llmlab.data.train_tokenizer.segments` cuts them)."""
    batch_chars = batch_chars or BATCH_CHARS
    batch = Batch(position=position)
    for doc in items:
        parts = doc.text.split(separator) if separator and separator in doc.text else [doc.text]
        for k, part in enumerate(parts):
            if part:
                cut = pieces(part)
                batch.texts += cut
                batch.ends += [False] * len(cut)
                open_text = True
            if (k < len(parts) - 1 or doc.end) and open_text:  # a literal separator, or the document's end
                if batch.ends:
                    batch.ends[-1] = True
                else:
                    batch.texts.append("")
                    batch.ends.append(True)
                open_text = False
        batch.chars += len(doc.text)
        batch.nbytes += doc.nbytes
        if doc.repaired:
            batch.repaired += doc.repaired
            batch.repaired_names.append(doc.name)
        batch.docs += int(doc.end)
        batch.position += 1
        batch.open_text = open_text
        if batch.chars >= batch_chars:
            yield batch
            batch = Batch(position=batch.position, open_text=open_text)
    if batch.texts or batch.docs or batch.nbytes:
        yield batch


class Progress:
    """Progress of one stage over bytes: a rich bar on a terminal, else a line every
    `LOG_EVERY_S` (and at the end), both with MB/s, tokens/s and the time left."""

    def __init__(self, bar, label: str, total: int | None):
        self.bar, self.label, self.total = bar, label, total
        self.task = bar.add_task(label, total=total, rate="") if bar is not None else None
        self.t0 = self.last = time.perf_counter()
        self.done = self.tokens = 0

    def rate(self) -> str:
        dt = max(1e-9, time.perf_counter() - self.t0)
        text = f"{self.done / dt / 1e6:.1f} MB/s"
        return text + (f", {self.tokens / dt / 1e6:.2f}M tok/s" if self.tokens else "")

    def update(self, nbytes: int, tokens: int = 0, final: bool = False) -> None:
        self.done += nbytes
        self.tokens += tokens
        if self.task is not None:
            self.bar.update(self.task, completed=self.done, rate=self.rate())
            return
        now = time.perf_counter()
        if final or now - self.last >= LOG_EVERY_S:
            self.last = now
            of = f" of {self.total / 1e6:,.1f} MB ({100 * self.done / self.total:.0f}%)" if self.total else ""
            left = ""
            if self.total and self.done and not final:
                left = f", about {(self.total - self.done) * (now - self.t0) / self.done:.0f} s left"
            console.err.print(f"{self.label}: {self.done / 1e6:,.1f} MB{of}, {self.rate()}{left}",
                              highlight=False, soft_wrap=True)


class Builder:
    """Builds (or continues building, from ``progress``) one cache entry in ``partial``."""

    def __init__(self, corpus: Corpus, factory, partial: Path, workers: int | None, quiet: bool, shard_tokens: int,
                 progress: dict[str, Any]):
        size = corpus.size("train")
        # a corpus known to be small is read once, for the tokenizer and the encoding both
        corpus = _Held(corpus) if size is not None and size < SMALL_SPLIT else corpus
        self.corpus, self.factory, self.partial, self.quiet = corpus, factory, partial, quiet
        self.workers, self.shard_tokens = workers, shard_tokens
        self.progress = progress  # what an interrupted build got done (`read_progress`), carried on
        self.repaired_names: dict[str, None] = {}  # documents read here with bytes that were not UTF-8

    def save_progress(self) -> None:
        atomic_write_text(self.partial / "progress.json", json.dumps(self.progress, indent=1))

    def bar(self):
        if self.quiet or not console.err.is_terminal:
            return None
        from rich.progress import BarColumn, DownloadColumn, Progress as Bar, TextColumn, TimeElapsedColumn, \
            TimeRemainingColumn
        return Bar(TextColumn("{task.description:<22}"), BarColumn(), DownloadColumn(), TextColumn("{task.fields[rate]}"),
                   TimeElapsedColumn(), TimeRemainingColumn(), console=console.err, transient=False)

    def stage(self, bar, label: str, total: int | None):
        return Progress(bar, label, total) if not self.quiet else _Silent()

    def build(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        bar = self.bar()
        if bar is not None:
            bar.start()
        try:
            tok = self.tokenizer(bar)
            dtype = token_dtype(tok.vocab_size)
            splits = {name: self.encode(name, tok, dtype, bar) for name in SPLITS}
        finally:
            if bar is not None:
                bar.stop()
        timings = self.progress.setdefault("timings", {})
        timings["total_s"] = round(time.perf_counter() - t0 + timings.get("before_s", 0.0), 3)
        return {"vocab_size": tok.vocab_size, "dtype": dtype.name, "eos": tok.eos, "eos_id": tok.eos_id,
                "layout": "shards", **splits, "tokenizer_sample": self.progress.get("tokenizer_sample"),
                "timings": timings}

    def tokenizer(self, bar) -> TextTokenizer:
        path = self.partial / "tokenizer.json"
        if self.progress.get("tokenizer") and path.is_file():
            return TextTokenizer.load(path, self.progress.get("eos"))
        t0 = time.perf_counter()
        if self.factory.needs_training():
            used = {"of": self.corpus.size("train") or 0}
            budget = self.factory.train_bytes()
            stage = self.stage(bar, "train tokenizer", min(budget or used["of"], used["of"]) or None)
            # a corpus known to be small is held in this process already; any other trains in a child
            tok, used = train_tokenizer(self.corpus, self.factory, stage, in_child=not isinstance(self.corpus, _Held))
            stage.update(0, final=True)
            planned = self.factory.planned_vocab(self.factory.cfg)
            if planned and tok.vocab_size < planned and not self.quiet:
                floor = getattr(self.factory.cfg, "min_frequency", None)
                why = f"it has no more pairs seen at least tokenizer.min_frequency={floor} times to merge" \
                    if floor is not None else "it offers no more"
                console.err.print(f"tokenizer: the corpus gives {tok.vocab_size:,} tokens, fewer than tokenizer.vocab_size="
                                  f"{planned:,} asks for: {why}", style="yellow", highlight=False)
            self.progress["tokenizer_sample"] = {"bytes": used["bytes"], "read": used["read"], "of": used["of"]}
        else:
            tok = self.factory.make()
        tmp = path.with_name(".tokenizer.json.tmp")
        tok.save(tmp)
        os.replace(tmp, path)
        self.progress["tokenizer"], self.progress["eos"] = True, tok.eos
        self.progress.setdefault("timings", {})["tokenizer_s"] = round(time.perf_counter() - t0, 3)
        self.save_progress()
        return tok

    def workers_for(self, split: str) -> int:
        if self.workers is not None:
            return self.workers
        size = self.corpus.size(split)
        return 0 if size is not None and size < SMALL_SPLIT else (os.cpu_count() or 1)

    def encode(self, split: str, tok: TextTokenizer, dtype: np.dtype, bar) -> dict[str, Any]:
        state = self.progress.setdefault("splits", {}).setdefault(split, {"shards": [], "done": False})
        writer = SplitWriter(self.partial / split, dtype, self.shard_tokens, done=state["shards"])
        if not state["done"]:
            last = state["shards"][-1] if state["shards"] else {}
            position, open_text = last.get("position", 0), last.get("open_text", False)
            total = self.corpus.size(split)
            stage = self.stage(bar, f"encode {split}", total)
            stage.update(sum(s["bytes"] for s in state["shards"]))
            t0, cpu0 = time.perf_counter(), time.process_time()
            items = itertools.islice(self.corpus.stream(split), position, None)
            timer = _Timed(batches(items, tok.eos, position, open_text=open_text))
            encoded = encode_batches(timer, tok.tok, tok.eos_id, dtype, self.workers_for(split))
            for batch, ids in encoded:
                writer.write(ids, batch.nbytes, batch.docs, batch.repaired)
                self.repaired_names.update(dict.fromkeys(batch.repaired_names))
                stage.update(batch.nbytes, len(ids))
                if writer.full():
                    self.finish(state, writer, batch.position, batch.open_text)
            self.finish(state, writer, timer.position, timer.open_text)
            state["done"] = True
            timings = self.progress.setdefault("timings", {})
            for name, value in (("encode_s", time.perf_counter() - t0), ("read_s", timer.seconds),
                                ("main_cpu_s", time.process_time() - cpu0)):  # main_cpu_s: this process's CPU
                timings[f"{split}_{name}"] = round(timings.get(f"{split}_{name}", 0) + value, 3)
            self.save_progress()
            stage.update(0, final=True)
        shards = state["shards"]
        repaired = sum(s.get("repaired", 0) for s in shards)
        return {"tokens": sum(s["tokens"] for s in shards), "bytes": sum(s["bytes"] for s in shards),
                "docs": sum(s["docs"] for s in shards), **({"repaired": repaired} if repaired else {}),
                "shards": [{k: s[k] for k in ("file", "tokens", "bytes", "docs", "crc32") if k in s} for s in shards]}

    def finish(self, state: dict, writer: SplitWriter, position: int, open_text: bool = False) -> None:
        entry = writer.finish_shard(position)
        if entry is None and not state["shards"]:  # an empty split still has one (empty) shard
            writer.write(np.zeros(0, dtype=writer.dtype), 0, 0)
            entry = writer.finish_shard(position)
        if entry is not None:
            entry["open_text"] = open_text
            state["shards"] = writer.shards
            self.save_progress()


class _Held:
    """A corpus whose splits are kept in memory after their first reading."""

    def __init__(self, corpus: Corpus):
        self.corpus, self.held = corpus, {}

    def size(self, split: str) -> int | None:
        return self.corpus.size(split)

    def stream(self, split: str) -> Iterator[Document]:
        if split not in self.held:
            self.held[split] = list(self.corpus.stream(split))
        return iter(self.held[split])


class _Timed:
    """Iterates ``batches``, adding up the time spent reading and cutting the text."""

    def __init__(self, source: Iterator[Batch]):
        self.source, self.seconds, self.position, self.open_text = source, 0.0, 0, False

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        t = time.perf_counter()
        try:
            batch = next(self.source)
        finally:
            self.seconds += time.perf_counter() - t
        self.position, self.open_text = batch.position, batch.open_text
        return batch


class _Silent:
    def update(self, *args, **kwargs) -> None:
        pass


def lock_partial(partial: Path, key: str, quiet: bool):
    """Hold ``partial``'s lock (flock: dropped by the kernel when the holder dies); wait, saying
    so, while another process holds it.

    Plain ``flock`` on an open file, not `llmlab.files.HolderLock` (filelock): the lock lives in
    the directory it guards and is held while that directory is renamed into place, so a waiter
    must wait on the file it opened; filelock reopens its path on every attempt (gone after the
    rename) and leaves its file behind, where the cache root must hold only entries."""
    import fcntl

    f = open_append(partial / ".lock", mode="a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        if not quiet:
            console.err.print(f"waiting: another llmlab (PID {holder}) is preparing {key}", highlight=False)
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def _shard_problem(split: str, i: int, entry) -> str | None:
    where = f"splits.{split}.shards[{i}]"
    if not isinstance(entry, dict):
        return f"{where} is not a mapping"
    if entry.get("file") != shard_name(i):  # a name is opened under the split's directory: never a path
        return f"{where}.file is {entry.get('file')!r}, not {shard_name(i)!r}"
    for key in ("tokens", "bytes", "docs", "crc32", "position"):
        if not is_count(entry.get(key)):
            return f"{where}.{key} is {entry.get(key)!r}, not a count"
    if not is_count(entry.get("repaired", 0)):
        return f"{where}.repaired is {entry.get('repaired')!r}, not a count"
    if not isinstance(entry.get("open_text", False), bool):
        return f"{where}.open_text is not true or false"
    return None


def read_progress(partial: Path) -> tuple[dict[str, Any], str | None]:
    """A partial build's ``progress.json`` (empty where there is none), and what is wrong with
    it (None: nothing; it has the shape `Builder` writes). Checked before a build continues
    from it, so a hand-edited or damaged one is said, not half-used."""
    path = partial / "progress.json"
    if not path.exists():
        return {}, None
    try:
        progress = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return {}, f"it is unreadable ({(str(e).splitlines() or [type(e).__name__])[0]})"
    return (progress, None) if (problem := _progress_problem(progress)) is None else ({}, problem)


def _progress_problem(progress) -> str | None:
    if not isinstance(progress, dict):
        return f"it holds a JSON {type(progress).__name__}, not an object"
    if not isinstance(progress.get("tokenizer", False), bool):
        return "tokenizer is not true or false"
    if not isinstance(progress.get("eos"), (str, type(None))):
        return "eos is not a string or null"
    sample = progress.get("tokenizer_sample")
    if sample is not None and not (isinstance(sample, dict) and all(is_count(sample.get(k)) for k in ("bytes", "read", "of"))):
        return "tokenizer_sample is not a mapping of byte counts"
    timings = progress.get("timings", {})
    if not isinstance(timings, dict) or not all(is_seconds(v) for v in timings.values()):
        return "timings is not a mapping of seconds"
    splits = progress.get("splits", {})
    if not isinstance(splits, dict):
        return "splits is not a mapping"
    for split, state in splits.items():
        if split not in SPLITS or not isinstance(state, dict):
            return f"splits.{split} is not a split's record"
        if not isinstance(state.get("done"), bool) or not isinstance(state.get("shards"), list):
            return f"splits.{split} lacks its done flag or its list of shards"
        for i, entry in enumerate(state["shards"]):
            if (problem := _shard_problem(split, i, entry)) is not None:
                return problem
    return None


def describe_resume(progress: dict[str, Any]) -> str | None:
    """What a partial build holds (its checked progress, `read_progress`), for the line that
    says a run continues it."""
    shards = sum(len(s["shards"]) for s in progress.get("splits", {}).values())
    if not progress.get("tokenizer"):
        return None
    return f"the tokenizer and {shards} finished shard{'s' if shards != 1 else ''}"


def repair_line(meta: dict[str, Any], names: list[str]) -> str | None:
    """The line that says how much of the corpus was not UTF-8 and was read as U+FFFD (None:
    none was); ``names``: the documents this process saw it in (a resumed build saw only its
    own part)."""
    counts = {split: meta[split].get("repaired", 0) for split in SPLITS}
    if not any(counts.values()):
        return None
    where = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (f"data: {counts['train']:,} byte sequences in train and {counts['val']:,} in val were not UTF-8 and are read "
            f"as U+FFFD (the replacement character)" + (f", in {where}" if names else ""))


def check_empty(meta: dict[str, Any]) -> None:
    if meta["train"]["docs"] + meta["val"]["docs"] == 0:
        raise UserError("data: the corpus is empty: no documents were found")
    if meta["train"]["tokens"] + meta["val"]["tokens"] == 0:
        docs, size = meta["train"]["docs"] + meta["val"]["docs"], meta["train"]["bytes"] + meta["val"]["bytes"]
        if size:  # text the tokenizer makes nothing of (a pretrained one with an empty vocabulary, say)
            raise UserError(f"data: the tokenizer encodes the corpus's {docs:,} documents ({size:,} bytes) to no "
                            "tokens; check the tokenizer (tokenizer.kind, tokenizer.path)")
        raise UserError(f"data: the corpus is empty: its {docs:,} documents hold no text")
