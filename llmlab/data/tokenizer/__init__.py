"""Tokenizers (config group ``tokenizer``), all Hugging Face `tokenizers` objects underneath,
so every kind saves to and loads from one ``tokenizer.json``. Each kind is one file in this
package, its class registered with ``@TOKENIZER.register(name)`` and holding its nested
``Config``; the package finds them all (`llmlab.registry.discover`)."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from tokenizers import Regex, Tokenizer, pre_tokenizers

from llmlab.errors import UserError
from llmlab.registry import Registry, discover

TOKENIZER = Registry("tokenizer", group="tokenizer")
EOS = "<|endoftext|>"


def byte_to_unicode() -> dict[int, str]:
    """The reversible byte -> printable character map of byte-level BPE (GPT-2): printable
    Latin-1 bytes stand for themselves, the rest are moved to code points from 256 up."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping, extra = {}, 0
    for b in range(256):
        if b in keep:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


# The longest piece BPE sees. GPT-2's pre-tokenizer makes one piece of a run of letters,
# digits, punctuation or spaces however long it is, and BPE's cost on one piece grows
# faster than its length: a 2 MB line of minified JSON or base64 did not finish in 150 s.
# Runs longer than this are cut into pieces of this length first (only such runs change).
MAX_PIECE_CHARS = 256


def long_run_splitter() -> pre_tokenizers.Split:
    """Isolates every MAX_PIECE_CHARS characters of a run of non-space (or of space)
    characters, so the pre-tokenizer after it never sees a longer run."""
    n = MAX_PIECE_CHARS
    return pre_tokenizers.Split(Regex(rf"\S{{{n}}}|\s{{{n}}}"), behavior="isolated")


class TextTokenizer:
    """A `tokenizers.Tokenizer` plus the id of its document separator."""

    def __init__(self, tok: Tokenizer, eos: str | None = EOS):
        self.tok = tok
        self.eos = eos
        self.eos_id = tok.token_to_id(eos) if eos else None
        if eos and self.eos_id is None:
            raise UserError(f"tokenizer.eos: '{eos}' is not in the tokenizer's vocabulary")

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        with engine_errors():
            return self.tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        with engine_errors():
            return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special)

    def save(self, path: str | Path) -> None:
        self.tok.save(str(path))

    @classmethod
    def load(cls, path: str | Path, eos: str | None = EOS) -> "TextTokenizer":
        try:
            return cls(Tokenizer.from_file(str(path)), eos)
        except Exception as e:  # the Rust side raises plain Exceptions for bad files
            raise UserError(f"cannot read tokenizer {path}: {str(e).splitlines()[0]}") from e


def vocab_sizes_if_different(ours: str | Path, theirs: str | Path) -> tuple[int, int] | None:
    """None when two tokenizer files map the same strings to the same ids, else the sizes of
    their vocabularies (ours, theirs), for a message."""
    a = TextTokenizer.load(ours, eos=None).tok.get_vocab()
    b = TextTokenizer.load(theirs, eos=None).tok.get_vocab()
    return None if a == b else (len(a), len(b))


@contextlib.contextmanager
def engine_errors():
    """The Rust engine panics (a BaseException, so no ``except Exception`` stops it) when a
    tokenizer.json's regex exhausts the regex engine's retry limit: that is the tokenizer's
    fault, said in one line. Rust's panic hook also writes its own lines (with a backtrace
    under RUST_BACKTRACE=1) straight to file descriptor 2, so while the engine runs that
    descriptor goes to a buffer, written out afterwards unless the engine panicked."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no descriptor 2 to hold
        saved = None
    panicked = False
    buf = tempfile.TemporaryFile() if saved is not None else None
    try:
        if buf is not None:
            os.dup2(buf.fileno(), 2)
        yield
    except BaseException as e:
        if type(e).__name__ != "PanicException":
            raise
        panicked = True
        reason = (str(e).splitlines() or ["a panic"])[0]
        raise UserError(f"tokenizer: the tokenizer failed on this text ({reason}); its pre-tokenizer regex is too "
                        "costly for the input: use another tokenizer.json, or tokenizer=bpe") from None
    finally:
        if buf is not None:
            sys.stderr.flush()  # what Python wrote meanwhile is in the buffer too
            os.dup2(saved, 2)
            os.close(saved)
            if not panicked:
                buf.seek(0)
                held = buf.read()
                if held:
                    os.write(2, held)
            buf.close()


class TokenizerFactory:
    @dataclass
    class Config:
        kind: str = ""

    def __init__(self, cfg):
        self.cfg = cfg

    @staticmethod
    def planned_vocab(cfg) -> int:
        """The vocabulary size these settings will give, before any text is read, for the checks
        that run before data preparation; where it cannot be known (a file not yet read), the
        smallest any tokenizer has: the 256 bytes and ``<|endoftext|>``."""
        return 257

    def fingerprint(self) -> dict[str, Any]:
        return dict(vars(self.cfg))

    def needs_training(self) -> bool:
        return False

    def train_bytes(self) -> int | None:
        """How much text training reads at most (None: everything)."""
        return None

    def make(self, texts: Callable[[], Iterable[str]] | None = None) -> TextTokenizer:
        raise NotImplementedError


discover(__name__, __path__)  # every kind's file, each registering itself
