"""corpus -> tokenizer -> token shards, cached by a key of the settings that made them.

One entry of the cache is a directory ``<cache>/<data>-<tokenizer>-<key>/`` holding
``train/`` and ``val/`` (token shards ``000000.bin``, ...), ``tokenizer.json`` and
``meta.json`` (with each shard's tokens, bytes and documents). It is built, streamed, under
``.partial-<key>`` (`llmlab.data.build`) and renamed into place, so an entry that exists is
complete; a killed build continues from its last finished shard. Entries written before
shards (``train.bin``, ``val.bin``) are still read.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any, Mapping, NoReturn

import numpy as np
from rich.table import Table

from llmlab import console
from llmlab.data.corpus import CORPUS
from llmlab.data.shards import TokenStore, read_shard, shard_name
from llmlab.data.tokenizer import TOKENIZER, TextTokenizer
from llmlab.errors import UserError
from llmlab.files import atomic_write_text, clean_stale, disk_error, own_dir

FORMAT_VERSION = 3  # 2: BPE pieces capped at MAX_PIECE_CHARS; 3: literal separators end documents
DEFAULT_CACHE = ".cache/llmlab"
PARTIAL = ".partial-"  # prefix of an entry being built

COUNT_LIMIT = 1 << 27  # tokens of a split that `Prepared.token_counts` reads at most


def cache_root(cache_dir: str | None = None) -> Path:
    return Path(os.path.expanduser(cache_dir or os.environ.get("LLMLAB_CACHE") or DEFAULT_CACHE))


@dataclass
class Prepared:
    """A complete cache entry."""

    path: Path
    meta: dict[str, Any]
    built: bool = False  # True when this call made the entry, False when it came from the cache

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    def tokens(self, split: str) -> TokenStore:
        """The split's token ids over its shards (memory-mapped), each checked against meta.json."""
        try:
            itemsize = np.dtype(self.meta["dtype"]).itemsize
            info = self.meta[split]
            shards = ([(self.path / split / own_shard(i, s["file"]), int(s["tokens"])) for i, s in enumerate(info["shards"])]
                      if "shards" in info
                      else [(self.path / f"{split}.bin", int(info["tokens"]))])  # an entry from before shards
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"data: the cache entry {self.path} has a damaged meta.json ({e}); delete that directory "
                            "and run again to prepare the data anew") from None
        arrays = []
        for path, tokens in shards:
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                size = None
            if size != tokens * itemsize:
                found = "is missing" if size is None else f"has {size:,} bytes, not the {tokens * itemsize:,} meta.json records"
                raise UserError(f"data: {path} {found}; the cache entry is damaged: delete {self.path} and run again to "
                                "prepare the data anew")
            arrays.append(read_shard(path, self.meta["dtype"]))
        return TokenStore(arrays)

    def token_counts(self, split: str = "train", limit: int = COUNT_LIMIT) -> np.ndarray:
        """(vocab_size,) int64: occurrences of each token id in the first ``limit`` tokens of
        ``split`` (a prefix keeps the cost bounded on large corpora; ranks barely move)."""
        return np.bincount(self.tokens(split)[:limit], minlength=self.vocab_size).astype(np.int64)

    def tokenizer(self) -> TextTokenizer:
        return TextTokenizer.load(self.path / "tokenizer.json", self.meta.get("eos"))

    def bytes_per_token(self, split: str) -> float:
        s = self.meta[split]
        return s["bytes"] / max(1, s["tokens"])


# data settings that change how an entry is made or laid out, not its tokens: not in the key
NOT_IN_KEY = ("workers", "shard_tokens", "doc_mask")


def settings_key(data_cfg: Any, tok_cfg: Any, fingerprint: Mapping[str, Any], tok_fingerprint: Mapping[str, Any]) -> str:
    data = {k: v for k, v in asdict(data_cfg).items() if k not in NOT_IN_KEY}
    blob = json.dumps({"version": FORMAT_VERSION, "data": data, "corpus": dict(fingerprint),
                       "tokenizer": dict(tok_fingerprint)}, sort_keys=True, default=str)
    return f"{data_cfg.kind}-{tok_cfg.kind}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def prepare(data: Any, tokenizer: Any, cache_dir: str | None = None, quiet: bool = False) -> Prepared:
    """Return the cache entry for these settings, building it if it does not exist yet (or
    continuing the build a killed run left). ``data`` and ``tokenizer``: their typed Configs
    (a resolved job's), or plain mappings, checked here."""
    from llmlab.data.build import Builder, check_empty, describe_resume, lock_partial, read_progress, repair_line

    data_cfg = data if is_dataclass(data) else CORPUS.config(data, "data")
    tok_cfg = tokenizer if is_dataclass(tokenizer) else TOKENIZER.config(tokenizer, "tokenizer")
    corpus = CORPUS.build(data_cfg)
    factory = TOKENIZER.build(tok_cfg)
    key = settings_key(data_cfg, tok_cfg, corpus.fingerprint(), factory.fingerprint())
    root = cache_root(cache_dir)
    final = root / key
    if (final / "meta.json").is_file():
        return Prepared(final, read_meta(final))

    partial = root / f"{PARTIAL}{key}"
    try:
        try:
            root.mkdir(parents=True, exist_ok=True)
        except FileNotFoundError as e:  # a parent that takes no directories (/proc), or one that vanished
            raise UserError(f"cannot create the cache directory {root} ({e.strerror.lower()}: {e.filename}); set "
                            "cache_dir (or LLMLAB_CACHE) to a directory that can be written") from e
        clean_stale(root)  # temporary directories of writers that died
        own_dir(partial)
        lock = lock_partial(partial, key, quiet)
        try:
            if (final / "meta.json").is_file():  # a twin process finished it while this one waited
                shutil.rmtree(partial, ignore_errors=True)  # a directory made after the twin's rename
                return Prepared(final, read_meta(final))
            if final.exists() or final.is_symlink():  # an entry without its meta.json: damaged or cut short
                aside = root / f".damaged-{key}-{time.strftime('%Y%m%d-%H%M%S')}"
                os.rename(final, aside)
                console.err.print(f"cache entry {final} has no readable meta.json: set aside as {aside} (delete it "
                                  "when you no longer need it); preparing the data again", style="yellow")
            progress, problem = read_progress(partial)
            if problem is not None:  # nothing of it can be trusted: set its files aside, said, and start again
                aside = root / f".damaged-partial-{key}-{time.strftime('%Y%m%d-%H%M%S')}"
                aside.mkdir()
                for p in partial.iterdir():
                    if p.name != ".lock":  # held by this process
                        os.rename(p, aside / p.name)
                console.err.print(f"an interrupted preparation of {key} has a damaged progress.json ({problem}): its "
                                  f"files are set aside as {aside} (delete it when you no longer need it); preparing "
                                  "the data again", style="yellow")
            held = describe_resume(progress)
            if held and not quiet:
                console.err.print(f"continuing an interrupted preparation of {key}: {held} are kept", highlight=False)
            builder = Builder(corpus, factory, partial, data_cfg.workers, quiet, data_cfg.shard_tokens, progress)
            meta = {"version": FORMAT_VERSION, **builder.build(),
                    "settings": {"data": asdict(data_cfg), "tokenizer": asdict(tok_cfg)},
                    "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "key": key}
            check_empty(meta)
            if (line := repair_line(meta, list(builder.repaired_names))) is not None and not quiet:
                console.err.print(line, style="yellow", highlight=False)
            atomic_write_text(partial / "meta.json", json.dumps(meta, indent=2))
            (partial / "progress.json").unlink()
            os.rename(partial, final)  # atomic: the entry appears complete or not at all
            (final / ".lock").unlink()
        finally:
            lock.close()
    except UserError:
        shutil.rmtree(partial, ignore_errors=True)  # the data's fault: nothing worth continuing
        raise
    except OSError as e:
        problem = disk_error(e, f"the prepared data in {root}", "free space or set cache_dir (or LLMLAB_CACHE) to "
                             "another directory; the next run continues from the last finished shard")
        if problem is not None:
            raise problem from e
        raise
    prepared = Prepared(final, read_meta(final), built=True)
    if not quiet:
        print_summary(prepared)
    return prepared


def own_shard(index: int, name: Any) -> str:
    """The file name of a split's ``index``-th shard, as meta.json records it: only the name the
    builder gives that shard is accepted, so a hand-edited index never opens another path
    (``../x``, an absolute path, a NUL byte)."""
    if name != shard_name(index):
        raise ValueError(f"shard {index} is named {str(name)[:40]!r}, not {shard_name(index)!r}")
    return name


def read_meta(entry: Path) -> dict[str, Any]:
    try:
        meta = json.loads((entry / "meta.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UserError(f"data: {entry / 'meta.json'} is unreadable ({type(e).__name__}); delete {entry} and run "
                        "again to prepare the data anew") from None
    if not isinstance(meta, dict):
        raise UserError(f"data: {entry / 'meta.json'} is not a JSON object; delete {entry} and run again")
    check_meta(meta, entry)
    return meta


def check_meta(meta: dict[str, Any], entry: Path) -> None:
    """What the commands read of a cache entry's meta.json, each field of the type the builder
    writes, so that a hand-edited or damaged one is one line naming the field, whichever
    command reads it first (the shard names and sizes are checked where the shards are read)."""
    def bad(field: str, expected: str) -> NoReturn:
        raise UserError(f"data: {entry / 'meta.json'}: {field} must be {expected}; the cache entry is damaged: delete "
                        f"{entry} and run again to prepare the data anew")

    from llmlab.perf import is_count as count, is_seconds as seconds

    if not count(meta.get("vocab_size")) or meta["vocab_size"] < 1:
        bad("vocab_size", "a positive integer")
    if meta.get("dtype") not in ("uint16", "uint32"):
        bad("dtype", "uint16 or uint32")
    if "eos" not in meta or meta["eos"] is not None and not isinstance(meta["eos"], str):
        bad("eos", "a string or null")
    for split in ("train", "val"):
        info = meta.get(split)
        if not isinstance(info, dict):
            bad(split, "a mapping")
        for key in ("tokens", "bytes", "docs"):
            if not count(info.get(key)):
                bad(f"{split}.{key}", "a count (an integer >= 0)")
        if not count(info.get("repaired", 0)):
            bad(f"{split}.repaired", "a count (an integer >= 0)")
        shards = info.get("shards", [])
        if not isinstance(shards, list) or not all(isinstance(sh, dict) and count(sh.get("tokens")) for sh in shards):
            bad(f"{split}.shards", "a list of shards, each with its token count")
        if not all(sh.get("crc32") is None or count(sh["crc32"]) and sh["crc32"] < 2**32 for sh in shards):
            bad(f"{split}.shards", "shards whose crc32 is a CRC-32 (an integer from 0 to 2^32 - 1)")
    timings = meta.get("timings", {})
    if not isinstance(timings, dict) or not all(seconds(v) for v in timings.values()):
        bad("timings", "a mapping of seconds (numbers >= 0)")
    sample = meta.get("tokenizer_sample")
    if sample is not None and not (isinstance(sample, dict) and seconds(sample.get("bytes"))
                                   and (sample.get("of") is None or seconds(sample.get("of")))):
        bad("tokenizer_sample", "null or a mapping with its bytes")


def verify_shards(prepared: Prepared) -> dict[str, int]:
    """Every shard of the entry read back against the CRC-32 meta.json recorded when it was
    written: a flipped byte that still gives a valid id is found here, not trained on. One line
    naming the shard when one differs. Returns how many were checked, how many predate
    checksums (none recorded) and the bytes read."""
    from llmlab.data.shards import shard_crc

    done = {"checked": 0, "unrecorded": 0, "bytes": 0}
    for split in ("train", "val"):
        prepared.tokens(split)  # names and sizes first, each against meta.json
        for i, shard in enumerate(prepared.meta[split].get("shards", [])):
            if shard.get("crc32") is None:
                done["unrecorded"] += 1
                continue
            path = prepared.path / split / own_shard(i, shard["file"])
            crc = shard_crc(path)
            if crc != shard["crc32"]:
                raise UserError(f"data: {path} changed since it was written (CRC-32 {crc:08x}, meta.json records "
                                f"{shard['crc32']:08x}); the cache entry is damaged: delete {prepared.path} and run "
                                "again to prepare the data anew")
            done["checked"] += 1
            done["bytes"] += path.stat().st_size
    return done


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
    t = m.get("timings") or {}  # optional in meta.json (`check_meta`): an entry without them prints none
    if not t:
        console.out.print(f"vocab {m['vocab_size']:,} ({m['dtype']}); meta.json records no timings")
        return
    if "tokenizer_s" not in t or "train_encode_s" not in t:  # an entry from before shards: its own timings
        console.out.print(f"vocab {m['vocab_size']:,} ({m['dtype']}); total {t.get('total_s', 0):.1f}s")
        return
    sample = m.get("tokenizer_sample") or {}
    used = (f" on {sample['bytes'] / 1e6:,.1f} MB" + (f" of {sample['of'] / 1e6:,.1f} MB" if sample.get("of") else "")
            if sample else "")
    encode = t["train_encode_s"] + t.get("val_encode_s", 0)
    console.out.print(f"vocab {m['vocab_size']:,} ({m['dtype']}); tokenizer {t['tokenizer_s']:.1f}s{used}, "
                      f"encode {encode:.1f}s ({sum(len(m[s].get('shards', [])) for s in ('train', 'val'))} shards), "
                      f"total {t.get('total_s', 0):.1f}s")
