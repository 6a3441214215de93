"""Documents and the primitives that read and cut them, for every corpus kind: a file larger
than `PART_BYTES` is read in parts, each cut where a cut leaves byte-level BPE's
pre-tokenization unchanged (`SAFE_CUT`); a document's text is encoded in `pieces`; the split
is decided per document by a hash of its name (`hash_fraction`, `val_names`), and a corpus of
one file is cut at a line (`line_cut`).
"""

from __future__ import annotations

import codecs
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

PART_BYTES = 4 << 20  # a larger file is read in parts of about this size

# Cutting at a newline between two non-space characters leaves byte-level BPE's
# pre-tokenization unchanged, so the parts of a text encode to exactly the ids of the whole.
SAFE_CUT = re.compile(r"(?<=\S)\n(?=\S)")
# Pieces of a document, cut at `SAFE_CUT`s, encode to exactly the ids of the whole; they keep
# the encoder's threads busy and the progress bar moving.
PIECE_CHARS = 8192


def pieces(text: str, size: int = PIECE_CHARS) -> list[str]:
    """``text`` cut at the first `SAFE_CUT` after every ``size`` characters."""
    out, start = [], 0
    while len(text) - start > size:
        m = SAFE_CUT.search(text, start + size)
        if not m:
            break
        out.append(text[start:m.end()])
        start = m.end()
    out.append(text[start:])
    return out


@dataclass
class Document:
    """A document, or a part of one (``end`` False: more of the same document follows)."""

    name: str
    text: str
    nbytes: int  # bytes of the source as stored, before any decoding repair
    end: bool = True
    repaired: int = 0  # byte sequences that were not UTF-8, read as U+FFFD


REPLACEMENT = "\ufffd"
_REPLACEMENT_UTF8 = REPLACEMENT.encode("utf-8")


def repairs(raw: bytes, text: str, before: bytes = b"") -> int:
    """How many U+FFFD in ``text`` (decoded from ``raw`` with errors="replace") stand for
    bytes that were not UTF-8, rather than for a U+FFFD written in the source; ``before``: the
    last bytes already decoded, so that one written across two reads is counted once."""
    if REPLACEMENT not in text:
        return 0
    return text.count(REPLACEMENT) - (before[-2:] + raw).count(_REPLACEMENT_UTF8)


def hash_fraction(name: str) -> float:
    """Where a document's name falls in [0, 1): the split's and the tokenizer sample's rule."""
    return int(hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:15], 16) / 16**15


def val_names(names: Sequence[str], val_fraction: float) -> set[str]:
    """The names that are validation: hash below ``val_fraction``; with every name known, a
    split left empty gets the lowest (or gives up the highest) hash."""
    if len(names) < 2:
        return set()
    ranked = sorted(names, key=hash_fraction)
    val = {n for n in names if hash_fraction(n) < val_fraction}
    if not val:
        val = {ranked[0]}
    if len(val) == len(names):
        val.discard(ranked[-1])
    return val


def read_parts(path: Path, name: str, start: int = 0, stop: int | None = None,
               part_bytes: int = PART_BYTES) -> Iterator[Document]:
    """The bytes [start, stop) of a file as documents parts of about ``part_bytes``, decoded as
    UTF-8 (a few stdlib files are not: repaired, with the honest byte count), each part cut at a
    `SAFE_CUT` (a part with none runs on to the next)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    with open(path, "rb") as f:
        f.seek(start)
        left = (os.fstat(f.fileno()).st_size if stop is None else stop) - start
        text, nbytes, repaired, before = "", 0, 0, b""
        while True:
            raw = f.read(min(part_bytes, max(0, left)))
            left -= len(raw)
            last = not raw or left <= 0
            decoded = decoder.decode(raw, final=last)
            repaired += repairs(raw, decoded, before)
            text += decoded
            nbytes += len(raw)
            before = (before + raw)[-2:]
            if last:
                yield Document(name, text, nbytes, end=True, repaired=repaired)
                return
            m = SAFE_CUT.search(text, max(0, len(text) - part_bytes // 2))
            if m and m.end() < len(text):
                head = text[:m.end()]
                # the part's share of the source bytes: exact unless decoding repaired bytes
                head_bytes = min(nbytes, len(head.encode("utf-8", "surrogatepass")))
                head_repaired = min(repaired, head.count(REPLACEMENT))
                yield Document(name, head, head_bytes, end=False, repaired=head_repaired)
                text, nbytes, repaired = text[m.end():], nbytes - head_bytes, repaired - head_repaired


def line_cut(path: Path, val_fraction: float) -> int:
    """The byte offset where one file's validation part starts: after the first newline
    past ``1 - val_fraction`` of its bytes."""
    size = path.stat().st_size
    cut = int(size * (1 - val_fraction))
    with open(path, "rb") as f:
        f.seek(cut)
        while True:
            block = f.read(1 << 16)
            i = block.find(b"\n")
            if i >= 0:
                offset = cut + i + 1
                return offset if offset < size else int(size * (1 - val_fraction))
            if not block:
                return int(size * (1 - val_fraction))
            cut += len(block)


def read_file(path: Path, root: Path | None = None) -> Document:
    """One whole file as a document (``eval text=``: a file the user names)."""
    raw = path.read_bytes()
    name = str(path.relative_to(root)) if root else str(path)
    text = raw.decode("utf-8", errors="replace")
    return Document(name, text, len(raw), repaired=repairs(raw, text))
