"""corpus -> tokenizer -> token shards, cached by a key of the settings that made them.

One entry of the cache is a directory ``<cache>/<data>-<tokenizer>-<key>/`` holding
``train.bin``, ``val.bin``, ``tokenizer.json`` and ``meta.json``. It is built under a
temporary name and renamed into place, so an entry that exists is complete.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from llmlab import console
from llmlab.data.corpus import CORPUS, Document
from llmlab.data.shards import ShardWriter, read_shard, token_dtype
from llmlab.data.tokenizer import EOS, TOKENIZER, TextTokenizer
from llmlab.errors import UserError
from llmlab.files import clean_stale, disk_error, owned_tmp_dir

FORMAT_VERSION = 3  # 2: BPE pieces capped at MAX_PIECE_CHARS; 3: literal separators end documents
DEFAULT_CACHE = ".cache/llmlab"

# Cutting a document at a newline between two non-space characters leaves byte-level BPE's
# pre-tokenization unchanged, so pieces encode to exactly the ids of the whole; pieces keep
# both encoder threads busy and the progress bar moving.
_SAFE_CUT = re.compile(r"(?<=\S)\n(?=\S)")
PIECE_CHARS = 8192
COUNT_LIMIT = 1 << 27  # tokens of a split that `Prepared.token_counts` reads at most


def cache_root(cache_dir: str | None = None) -> Path:
    return Path(os.path.expanduser(cache_dir or os.environ.get("LLMLAB_CACHE") or DEFAULT_CACHE))


def pieces(text: str, size: int = PIECE_CHARS) -> list[str]:
    out, start = [], 0
    while len(text) - start > size:
        m = _SAFE_CUT.search(text, start + size)
        if not m:
            break
        out.append(text[start:m.end()])
        start = m.end()
    out.append(text[start:])
    return out


def segments(text: str, separator: str | None) -> list[str]:
    """A document's texts between literal separators: corpora such as TinyStories mark their
    document boundaries with ``<|endoftext|>`` in the text itself. Each segment is encoded as
    a document of its own (the separator id follows it), and the literal is never text that
    tokenizer training learns merges from (``<|``, ``endoft``: merges that could never fire,
    since encoding maps the literal to its id)."""
    if not separator or separator not in text:
        return [text]
    return [part for part in text.split(separator) if part]


def training_batches(docs: list[Document], per_batch: int = 32, separator: str | None = EOS):
    """Batches of text for tokenizer training: pieces, which pre-tokenize exactly like their
    documents (so counts are unchanged) and let one large document use every thread."""
    for i in range(0, len(docs), per_batch):
        chunk = docs[i:i + per_batch]
        yield chunk, [p for d in chunk for seg in segments(d.text, separator) for p in pieces(seg)]


@dataclass
class Prepared:
    """A complete cache entry."""

    path: Path
    meta: dict[str, Any]
    built: bool = False  # True when this call made the entry, False when it came from the cache

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    def tokens(self, split: str) -> np.ndarray:
        """The split's token ids (memory-mapped), after checking the shard against meta.json."""
        path = self.path / f"{split}.bin"
        try:
            expected = int(self.meta[split]["tokens"]) * np.dtype(self.meta["dtype"]).itemsize
            size = path.stat().st_size
        except FileNotFoundError:
            size, expected = None, 0
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"data: the cache entry {self.path} has a damaged meta.json ({e}); delete that directory "
                            "and run again to prepare the data anew") from None
        if size != expected:
            found = "is missing" if size is None else f"has {size:,} bytes, not the {expected:,} meta.json records"
            raise UserError(f"data: {path} {found}; the cache entry is damaged: delete {self.path} and run again to "
                            "prepare the data anew")
        return read_shard(path, self.meta["dtype"])

    def token_counts(self, split: str = "train", limit: int = COUNT_LIMIT) -> np.ndarray:
        """(vocab_size,) int64: occurrences of each token id in the first ``limit`` tokens of
        ``split`` (a prefix keeps the cost bounded on large corpora; ranks barely move)."""
        return np.bincount(self.tokens(split)[:limit], minlength=self.vocab_size).astype(np.int64)

    def tokenizer(self) -> TextTokenizer:
        return TextTokenizer.load(self.path / "tokenizer.json", self.meta.get("eos"))

    def bytes_per_token(self, split: str) -> float:
        s = self.meta[split]
        return s["bytes"] / max(1, s["tokens"])


def settings_key(data_cfg: Any, tok_cfg: Any, fingerprint: Mapping[str, Any], tok_fingerprint: Mapping[str, Any]) -> str:
    blob = json.dumps({"version": FORMAT_VERSION, "data": asdict(data_cfg), "corpus": dict(fingerprint),
                       "tokenizer": dict(tok_fingerprint)}, sort_keys=True, default=str)
    return f"{data_cfg.kind}-{tok_cfg.kind}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def _progress(disable: bool = False) -> Progress:
    return Progress(TextColumn("{task.description:<22}"), BarColumn(), DownloadColumn(),
                    TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                    console=console.err, transient=False, disable=disable)


def _encode_split(docs: list[Document], tok: TextTokenizer, writer: ShardWriter, progress: Progress,
                  label: str, batch_pieces: int = 256) -> None:
    """Encode documents into ``writer``, each (and each segment between literal separators)
    followed by the separator."""
    total = sum(d.nbytes for d in docs)
    task = progress.add_task(f"encode {label}", total=total, rate="")
    t0 = time.perf_counter()
    batch: list[str] = []
    ends: list[bool] = []
    done_bytes = 0

    def flush():
        for ids, end in zip(tok.encode_batch(batch), ends):
            writer.write(ids)
            if end and tok.eos_id is not None:
                writer.write([tok.eos_id])
        batch.clear()
        ends.clear()

    for doc in docs:
        for seg in segments(doc.text, tok.eos):
            parts = pieces(seg)
            batch.extend(parts)
            ends.extend([False] * (len(parts) - 1) + [True])
        done_bytes += doc.nbytes
        if len(batch) >= batch_pieces:
            flush()
            rate = writer.count / max(1e-9, time.perf_counter() - t0)
            progress.update(task, completed=done_bytes, rate=f"{rate / 1e6:.2f}M tok/s")
    flush()
    rate = writer.count / max(1e-9, time.perf_counter() - t0)
    progress.update(task, completed=total, rate=f"{rate / 1e6:.2f}M tok/s")


def prepare(data_section: Mapping[str, Any], tok_section: Mapping[str, Any], cache_dir: str | None = None,
            quiet: bool = False) -> Prepared:
    """Return the cache entry for these settings, building it if it does not exist yet."""
    data_cfg = CORPUS.config(data_section, "data")
    tok_cfg = TOKENIZER.config(tok_section, "tokenizer")
    corpus = CORPUS.build(data_cfg)
    factory = TOKENIZER.build(tok_cfg)
    key = settings_key(data_cfg, tok_cfg, corpus.fingerprint(), factory.fingerprint())
    root = cache_root(cache_dir)
    final = root / key
    if (final / "meta.json").is_file():
        return Prepared(final, read_meta(final))

    tmp = None
    try:
        root.mkdir(parents=True, exist_ok=True)
        clean_stale(root)  # entries half-built by a process that died
        tmp = owned_tmp_dir(root, key)
        meta = _build(corpus, factory, data_cfg, tok_cfg, tmp, quiet)
        meta["key"] = key
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        try:
            os.rename(tmp, final)  # atomic: the entry appears complete or not at all
        except OSError:
            if not (final / "meta.json").is_file():  # not a concurrent twin: a real failure
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException as e:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        problem = disk_error(e, f"the prepared data in {root}", "free space or set cache_dir (or LLMLAB_CACHE) to "
                             "another directory") if isinstance(e, OSError) else None
        if problem is not None:
            raise problem from e
        raise
    prepared = Prepared(final, read_meta(final), built=True)
    if not quiet:
        print_summary(prepared)
    return prepared


def read_meta(entry: Path) -> dict[str, Any]:
    try:
        meta = json.loads((entry / "meta.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UserError(f"data: {entry / 'meta.json'} is unreadable ({type(e).__name__}); delete {entry} and run "
                        "again to prepare the data anew") from None
    if not isinstance(meta, dict):
        raise UserError(f"data: {entry / 'meta.json'} is not a JSON object; delete {entry} and run again")
    return meta


def _build(corpus, factory, data_cfg, tok_cfg, out: Path, quiet: bool) -> dict[str, Any]:
    t0 = time.perf_counter()
    status = console.err.status("reading the corpus") if not quiet else contextlib.nullcontext()
    with status:
        split = corpus.split()
    t_read = time.perf_counter() - t0
    train_bytes = sum(d.nbytes for d in split.train)

    with _progress(disable=quiet) as progress:
        t1 = time.perf_counter()
        if factory.needs_training():
            task = progress.add_task("train tokenizer", total=train_bytes, rate="")

            def texts():
                done = 0
                for chunk, batch in training_batches(split.train):
                    yield batch
                    done += sum(d.nbytes for d in chunk)
                    progress.update(task, completed=done)

            tok = factory.make(texts, total=(len(split.train) + 31) // 32)
            rate = train_bytes / max(1e-9, time.perf_counter() - t1)
            progress.update(task, completed=train_bytes, rate=f"{rate / 1e6:.1f} MB/s")
        else:
            tok = factory.make()
        t_tok = time.perf_counter() - t1

        dtype = token_dtype(tok.vocab_size)
        t2 = time.perf_counter()
        counts = {}
        for name, docs in (("train", split.train), ("val", split.val)):
            with ShardWriter(out / f"{name}.bin", dtype) as writer:
                _encode_split(docs, tok, writer, progress, name)
            counts[name] = {"tokens": writer.count, "bytes": sum(d.nbytes for d in docs), "docs": len(docs)}
        t_enc = time.perf_counter() - t2
    tok.save(out / "tokenizer.json")
    return {
        "version": FORMAT_VERSION,
        "vocab_size": tok.vocab_size,
        "dtype": dtype.name,
        "eos": tok.eos,
        "eos_id": tok.eos_id,
        **counts,
        "settings": {"data": asdict(data_cfg), "tokenizer": asdict(tok_cfg)},
        "timings": {"read_s": round(t_read, 3), "tokenizer_s": round(t_tok, 3), "encode_s": round(t_enc, 3),
                    "total_s": round(time.perf_counter() - t0, 3)},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def print_summary(prepared: Prepared, cached: bool = False) -> None:
    m = prepared.meta
    table = Table(title=f"prepared data{' (cached)' if cached else ''}: {prepared.path}", title_justify="left")
    for col in ("split", "files", "bytes", "tokens", "bytes/token"):
        table.add_column(col, justify="right" if col != "split" else "left")
    for split in ("train", "val"):
        s = m[split]
        table.add_row(split, f"{s['docs']:,}", f"{s['bytes']:,}", f"{s['tokens']:,}",
                      f"{s['bytes'] / max(1, s['tokens']):.2f}")
    console.out.print(table)
    t = m["timings"]
    console.out.print(f"vocab {m['vocab_size']:,} ({m['dtype']}); read {t['read_s']:.1f}s, tokenizer "
                      f"{t['tokenizer_s']:.1f}s, encode {t['encode_s']:.1f}s, total {t['total_s']:.1f}s")
