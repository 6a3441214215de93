"""Tokenizing one very long line with no whitespace (minified JSON, base64, DNA): the cost
must grow linearly with its length. BPE's cost on one pre-token grows faster than its length,
so llmlab's BPE cuts runs longer than MAX_PIECE_CHARS before the GPT-2 pre-tokenizer; the
same run measures the uncut pre-tokenizer at small sizes as the reference.

    python -m bench.long_line                 # 2 MB and 20 MB lines; results/long_line.json
"""

from __future__ import annotations

import argparse
import base64
import random
import time

from bench.common import write_result
from llmlab.data.prepare import pieces
from llmlab.data.tokenizer import TOKENIZER, TextTokenizer


def line(kind: str, n: int) -> str:
    rng = random.Random(0)
    if kind == "base64":
        return base64.b64encode(rng.randbytes(n * 3 // 4 + 3)).decode()[:n]
    if kind == "dna":
        return "".join(rng.choice("ACGT") for _ in range(n))
    raise ValueError(kind)


def measure(text: str, cut: bool, vocab: int, repeats: int) -> dict:
    """Tokenizer training and encoding of ``text`` (one document, one line); medians."""
    factory = TOKENIZER.build(TOKENIZER.config({"kind": "bpe", "vocab_size": vocab}, "tokenizer"))
    train, encode = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        if cut:
            tok = factory.make(lambda: iter([pieces(text)]), total=1)
        else:  # the reference: GPT-2's pre-tokenizer alone, as before the cap
            from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
            raw = Tokenizer(models.BPE())
            raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            raw.decoder = decoders.ByteLevel()
            t0 = time.perf_counter()
            raw.train_from_iterator(iter([pieces(text)]), trainers.BpeTrainer(
                vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False,
                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()), length=1)
            tok = TextTokenizer(raw)
        t1 = time.perf_counter()
        ids = [i for p in tok.encode_batch(pieces(text)) for i in p]
        t2 = time.perf_counter()
        train.append(t1 - t0)
        encode.append(t2 - t1)
    assert tok.decode(ids) == text
    train.sort()
    encode.sort()
    return {"chars": len(text), "cut": cut, "train_s": round(train[len(train) // 2], 3),
            "encode_s": round(encode[len(encode) // 2], 3), "spread_train_s": [round(train[0], 3), round(train[-1], 3)],
            "tokens": len(ids), "mb_per_s": round(len(text) / 1e6 / max(1e-9, train[len(train) // 2] +
                                                                         encode[len(encode) // 2]), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2e6,2e7", help="line lengths in characters (cut pre-tokenizer)")
    ap.add_argument("--reference-sizes", default="5e4,1e5,2e5", help="line lengths for the uncut reference")
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for kind in ("base64", "dna"):
        for n in [int(float(x)) for x in args.reference_sizes.split(",")]:
            rows.append({"line": kind, **measure(line(kind, n), cut=False, vocab=args.vocab, repeats=args.repeats)})
            print(rows[-1], flush=True)
        for n in [int(float(x)) for x in args.reference_sizes.split(",") + args.sizes.split(",")]:
            repeats = args.repeats if n <= 2_000_000 else 1
            rows.append({"line": kind, **measure(line(kind, n), cut=True, vocab=args.vocab, repeats=repeats)})
            print(rows[-1], flush=True)
    write_result("long_line", {"command": "python -m bench.long_line", "vocab": args.vocab, "rows": rows,
                               "note": "medians of --repeats runs (one run at 20 MB); a shared machine, so "
                                       "spread_train_s gives min and max"})


if __name__ == "__main__":
    main()
