"""Tokenizer training and encoding speed, and the whole default `llmlab tokenize`.

    python -m bench.tokenize_speed [--repeats 3] [--shakespeare PATH]

Targets on 2 cores: BPE training >= 2 MB/s, encoding >= 0.8 M tokens/s, the whole default
tokenize <= 20 s. Each figure is the median of the repeats.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from bench.common import median_of, write_result
from llmlab.data.corpus import CORPUS
from llmlab.data.train_tokenizer import sample_for_tokenizer
from llmlab.data.prepare import pieces, prepare
from llmlab.data.tokenizer import TOKENIZER


def measure(data_section: dict, repeats: int) -> dict:
    corpus = CORPUS.build(CORPUS.config(data_section, "data"))
    train_docs = list(corpus.stream("train"))
    texts = [d.text for d in train_docs]
    nbytes = sum(d.nbytes for d in train_docs)
    factory = TOKENIZER.build(TOKENIZER.config({"kind": "bpe"}, "tokenizer"))
    tok_holder = {}

    def train():
        tok_holder["tok"] = factory.make(lambda: sample_for_tokenizer(corpus, None)[0])

    t_train, all_train = median_of(train, repeats)
    tok = tok_holder["tok"]
    parts = [p for t in texts for p in pieces(t)]
    count = {}

    def encode():
        count["n"] = sum(len(ids) for ids in tok.encode_batch(parts))

    t_enc, all_enc = median_of(encode, repeats)
    return {"train_bytes": nbytes, "train_docs": len(texts), "bpe_train_s": t_train,
            "bpe_train_mb_s": nbytes / t_train / 1e6, "encode_tokens": count["n"], "encode_s": t_enc,
            "encode_mtok_s": count["n"] / t_enc / 1e6, "bytes_per_token": nbytes / count["n"],
            "runs_train_s": all_train, "runs_encode_s": all_enc}


def whole_tokenize(repeats: int) -> dict:
    times = []
    for _ in range(repeats):
        cache = tempfile.mkdtemp(prefix="llmlab-bench-")
        try:
            t = time.perf_counter()
            prepare({"kind": "pysource"}, {"kind": "bpe"}, cache, quiet=True)
            times.append(time.perf_counter() - t)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    times.sort()
    return {"tokenize_default_s": times[len(times) // 2], "runs_s": times}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shakespeare", default="../shared/data/tinyshakespeare.txt",
                    help="tinyshakespeare.txt, measured too when the file exists")
    args = ap.parse_args()
    result = {"targets": {"bpe_train_mb_s": ">= 2", "encode_mtok_s": ">= 0.8", "tokenize_default_s": "<= 20"},
              "pysource": measure({"kind": "pysource"}, args.repeats), **whole_tokenize(args.repeats)}
    if Path(args.shakespeare).is_file():
        result["tinyshakespeare"] = measure({"kind": "text", "paths": [args.shakespeare]}, args.repeats)
    p = result["pysource"]
    print(f"stdlib corpus: BPE training {p['bpe_train_mb_s']:.2f} MB/s, encoding {p['encode_mtok_s']:.2f} M tok/s, "
          f"whole default tokenize {result['tokenize_default_s']:.1f} s (medians of {args.repeats})")
    if "tinyshakespeare" in result:
        s = result["tinyshakespeare"]
        print(f"tinyshakespeare: BPE training {s['bpe_train_mb_s']:.2f} MB/s, encoding {s['encode_mtok_s']:.2f} M tok/s")
    write_result("tokenize_speed", result)


if __name__ == "__main__":
    main()
