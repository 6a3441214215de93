import json
from pathlib import Path

import numpy as np
import pytest

import llmlab.data.prepare as prep
from llmlab.data.corpus import CORPUS
from llmlab.data.documents import val_names
from llmlab.data.shards import ShardWriter, read_shard, token_dtype
from llmlab.errors import UserError

TEXT = {"kind": "text", "val_fraction": 0.25}
BYTE = {"kind": "byte"}


def test_shard_write_read_round_trip(tmp_path):
    for dtype, top in ((np.uint16, 2**16 - 1), (np.uint32, 2**20)):
        w = ShardWriter(tmp_path / "a.bin", dtype)
        w.write([1, 2, 3])
        w.write(np.array([top, 0]))
        w.close(sync=True)
        assert w.count == 5
        assert read_shard(tmp_path / "a.bin", dtype).tolist() == [1, 2, 3, top, 0]


def test_token_dtype_widens_for_large_vocabularies():
    assert token_dtype(8192) == np.uint16
    assert token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32


def test_prepare_writes_shards_and_meta_then_reuses_them(tmp_path, corpus_dir):
    data = {**TEXT, "paths": [str(corpus_dir / "*")]}
    first = prep.prepare(data, BYTE, str(tmp_path / "cache"), quiet=True)
    assert first.built
    meta = json.loads((first.path / "meta.json").read_text())
    assert meta["vocab_size"] == 257 and meta["dtype"] == "uint16"
    n = meta["train"]["docs"]
    assert n + meta["val"]["docs"] == 4 and n >= 1 and meta["val"]["docs"] >= 1
    train = first.tokens("train")
    # byte tokenizer: tokens = bytes + one separator per document
    assert meta["train"]["tokens"] == meta["train"]["bytes"] + n == len(train)
    assert (np.asarray(train) == 256).sum() == n
    assert [s["file"] for s in meta["train"]["shards"]] == ["000000.bin"]
    assert sum(s["tokens"] for s in meta["train"]["shards"]) == len(train)
    assert (first.path / "tokenizer.json").is_file()

    again = prep.prepare(data, BYTE, str(tmp_path / "cache"), quiet=True)
    assert not again.built and again.path == first.path
    # a changed setting is a new entry
    other = prep.prepare({**data, "val_fraction": 0.5}, BYTE, str(tmp_path / "cache"), quiet=True)
    assert other.built and other.path != first.path


def test_an_entry_whose_meta_json_lost_its_optional_timings_still_prints_its_summary(tmp_path, corpus_dir, capsys):
    data = {**TEXT, "paths": [str(corpus_dir / "*")]}
    entry = prep.prepare(data, BYTE, str(tmp_path / "cache"), quiet=True)
    meta = json.loads((entry.path / "meta.json").read_text())
    del meta["timings"]
    (entry.path / "meta.json").write_text(json.dumps(meta))
    again = prep.prepare(data, BYTE, str(tmp_path / "cache"), quiet=True)
    prep.print_summary(again, cached=True)
    assert "vocab 257 (uint16); meta.json records no timings" in capsys.readouterr().out


def test_an_interrupted_prepare_leaves_no_entry_and_the_next_run_continues(tmp_path, corpus_dir, monkeypatch):
    import llmlab.data.build as build

    data = {**TEXT, "paths": [str(corpus_dir / "*")]}
    encode = build.Builder.encode

    def interrupted(self, split, *args):
        if split == "val":
            raise KeyboardInterrupt  # as if the user pressed ^C halfway
        return encode(self, split, *args)

    monkeypatch.setattr(build.Builder, "encode", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prep.prepare(data, BYTE, str(tmp_path / "cache"), quiet=True)
    left = [p.name for p in (tmp_path / "cache").iterdir()]
    assert len(left) == 1 and left[0].startswith(".partial-")  # no entry, only what the next run continues
    monkeypatch.setattr(build.Builder, "encode", encode)
    again = prep.prepare(data, BYTE, str(tmp_path / "cache"), quiet=True)
    clean = prep.prepare(data, BYTE, str(tmp_path / "clean"), quiet=True)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [again.path.name]
    assert np.asarray(again.tokens("train")).tolist() == np.asarray(clean.tokens("train")).tolist()
    assert again.meta["val"] == clean.meta["val"]


def test_a_mistake_in_the_data_leaves_nothing_behind(tmp_path):
    (tmp_path / "a.txt").write_text("")
    (tmp_path / "b.txt").write_text("")
    with pytest.raises(UserError, match="the corpus is empty"):
        prep.prepare({**TEXT, "paths": [str(tmp_path / "*.txt")]}, BYTE, str(tmp_path / "cache"), quiet=True)
    assert list((tmp_path / "cache").iterdir()) == []


def test_changed_file_makes_a_new_entry(tmp_path, corpus_dir):
    data = {**TEXT, "paths": [str(corpus_dir / "*")]}
    first = prep.prepare(data, BYTE, str(tmp_path / "cache"), quiet=True)
    (corpus_dir / "alpha.py").write_text("changed\n" * 50)
    second = prep.prepare(data, BYTE, str(tmp_path / "cache"), quiet=True)
    assert second.path != first.path


def test_invalid_utf8_is_repaired_and_bytes_are_counted_honestly(tmp_path):
    """Bytes that are not UTF-8 read as U+FFFD, and are counted (meta.json, one line naming the
    file); a U+FFFD the source itself holds is text, not a repair."""
    from llmlab.data.build import repair_line

    raw = "caf\xe9 latin-1 text\n".encode("latin-1") * 40 + "written \ufffd\n".encode("utf-8")
    (tmp_path / "latin.txt").write_bytes(raw)
    (tmp_path / "clean.txt").write_text("plain text\n" * 40)
    p = prep.prepare({**TEXT, "paths": [str(tmp_path / "*.txt")]}, BYTE, str(tmp_path / "cache"), quiet=True)
    assert p.meta["train"]["bytes"] + p.meta["val"]["bytes"] == len(raw) + 11 * 40
    assert p.meta["train"].get("repaired", 0) + p.meta["val"].get("repaired", 0) == 40
    line = repair_line(p.meta, ["latin.txt"])
    assert "byte sequences" in line and "not UTF-8" in line and line.endswith("in latin.txt")
    assert repair_line({"train": {}, "val": {}}, []) is None


def test_repairs_are_counted_exactly_across_the_reads_of_a_large_file(tmp_path):
    """A file read in parts: a bad byte or a written U+FFFD that straddles two reads is counted
    once, and only the bad bytes count."""
    from llmlab.data.documents import read_parts

    unit = b"ab\xffc\n" + "x\ufffdy\n".encode("utf-8")  # one bad byte, one written U+FFFD
    raw = unit * 300
    (tmp_path / "f.txt").write_bytes(raw)
    for part_bytes in (7, 8, 9, 64, 1 << 20):  # every alignment of the reads against the units
        parts = list(read_parts(tmp_path / "f.txt", "f.txt", part_bytes=part_bytes))
        assert sum(d.repaired for d in parts) == 300, part_bytes
        assert "".join(d.text for d in parts) == raw.decode("utf-8", "replace")


def test_empty_corpus_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match=r"^data.paths: '.*nothing\*.txt' matches no file$"):
        prep.prepare({**TEXT, "paths": [str(tmp_path / "nothing*.txt")]}, BYTE, str(tmp_path / "c"), quiet=True)


@pytest.mark.parametrize("entry, message", [
    ("typo.txt", "typo.txt does not exist"),
    ("'*.md'", "'*.md' matches no file"),
    ("docs", "docs is a directory; name its files with a glob such as 'docs/**/*.txt'"),
    ("gone.txt", "gone.txt is not a regular file (a broken symbolic link)"),
])
def test_every_path_names_a_file(tmp_path, monkeypatch, entry, message):
    """One entry of data.paths that names no file, beside one that does, is one line; it was
    left out in silence and the corpus built from the rest."""
    monkeypatch.chdir(tmp_path)
    Path("a.txt").write_text("def f():\n    return 1\n" * 50)
    Path("docs").mkdir()
    Path("gone.txt").symlink_to("nowhere.txt")
    with pytest.raises(UserError) as e:
        prep.prepare({**TEXT, "paths": ["a.txt", entry.strip("'")]}, BYTE, str(tmp_path / "c"), quiet=True)
    assert str(e.value) == f"data.paths: {message}"
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())


def test_split_is_deterministic_disjoint_and_by_document(tmp_path):
    names = [f"dir{i % 7}/f{i}.py" for i in range(2000)]
    val = val_names(names, 0.1)
    assert val == val_names(list(reversed(names)), 0.1)  # the order the files come in does not matter
    assert 150 < len(val) < 250  # about val_fraction of the documents (binomial spread)
    assert val_names(names[:1000], 0.1) == val & set(names[:1000])  # decided per document, not per corpus
    # a handful of documents still gets one of each
    for few in (["a.txt", "b.txt"], ["a", "b", "c"]):
        assert 1 <= len(val_names(few, 0.5)) < len(few) and 1 <= len(val_names(few, 0.01)) < len(few)
    # streamed by a corpus of files: every document in exactly one split, whole
    d = tmp_path / "docs"
    d.mkdir()
    for i in range(60):
        (d / f"{i:02d}.txt").write_text(f"document {i}\n" * (i + 1))
    corpus = CORPUS.get("text")(CORPUS.config({**TEXT, "paths": [str(d / "*.txt")]}, "data"))
    seen = {split: [doc.name for doc in corpus.stream(split)] for split in ("train", "val")}
    assert not set(seen["train"]) & set(seen["val"]) and len(seen["train"]) + len(seen["val"]) == 60
    assert seen == {split: [doc.name for doc in corpus.stream(split)] for split in ("train", "val")}


def test_single_document_is_split_at_a_line(tmp_path):
    text = "".join(f"line {i}\n" for i in range(100))
    (tmp_path / "one.txt").write_text(text)
    corpus = CORPUS.get("text")(CORPUS.config({**TEXT, "paths": [str(tmp_path / "one.txt")], "val_fraction": 0.1}, "data"))
    train, val = list(corpus.stream("train")), list(corpus.stream("val"))
    assert "".join(d.text for d in train) + "".join(d.text for d in val) == text
    assert val[0].text.startswith("line ") and train[-1].text.endswith("\n")
    assert sum(d.nbytes for d in train + val) == len(text.encode())


def test_a_large_file_streams_in_parts_that_encode_like_the_whole(tmp_path):
    """A file larger than a part is read in parts cut where byte-level BPE's pre-tokenization
    is unchanged, so memory holds one part and the ids equal those of the whole text."""
    from llmlab.data.documents import read_parts

    text = "".join(f"def f{i}(x):\n    return x * {i}  # café\n" for i in range(3000))
    (tmp_path / "big.py").write_text(text, encoding="utf-8")
    parts = list(read_parts(tmp_path / "big.py", "big.py", part_bytes=4096))
    assert len(parts) > 20 and all(not p.end for p in parts[:-1]) and parts[-1].end
    assert "".join(p.text for p in parts) == text
    assert sum(p.nbytes for p in parts) == len(text.encode())
    p = prep.prepare({**TEXT, "paths": [str(tmp_path / "big.py")]}, {"kind": "bpe", "vocab_size": 300},
                     str(tmp_path / "cache"), quiet=True)
    tok = p.tokenizer()
    head = "".join(d.text for d in CORPUS.get("text")(CORPUS.config({**TEXT, "paths": [str(tmp_path / "big.py")]}, "data"))
                   .stream("train"))
    assert np.asarray(p.tokens("train")).tolist() == tok.encode(head) + [tok.eos_id]


def test_pysource_lists_stdlib_without_tests():
    corpus = CORPUS.get("pysource")(CORPUS.config({"kind": "pysource"}, "data"))
    files = corpus.files()
    rel = [str(Path(p).relative_to(corpus.root())) for p in files]
    assert len(files) > 300
    assert "os.py" in rel and "json/decoder.py" in rel
    assert not any(part in ("test", "tests", "idle_test") for r in rel for part in r.split("/")[:-1])
    assert not any(r.split("/")[-1].startswith("test_") for r in rel)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_hf_corpus_reads_local_files_through_datasets(tmp_path, fmt):
    import datasets

    rows = [{"text": f"document number {i} " * 20, "id": i} for i in range(40)]
    path = tmp_path / f"corpus.{fmt}"
    ds = datasets.Dataset.from_list(rows)
    ds.to_json(path) if fmt == "jsonl" else ds.to_parquet(path)
    data = {"kind": "hf", "path": str(path), "val_fraction": 0.1}
    p = prep.prepare(data, BYTE, str(tmp_path / "cache"), quiet=True)
    assert p.meta["train"]["docs"] + p.meta["val"]["docs"] == 40 and 1 <= p.meta["val"]["docs"] <= 10
    total = sum(len(r["text"].encode()) for r in rows)
    assert p.meta["train"]["bytes"] + p.meta["val"]["bytes"] == total
    with pytest.raises(UserError, match=r"^data.text_column: 'body' is not a column; columns: text, id"):
        prep.prepare({**data, "text_column": "body"}, BYTE, str(tmp_path / "cache"), quiet=True)
    with pytest.raises(UserError, match=r"^data.text_column: 'id' holds int64, not text; the text columns: text$"):
        prep.prepare({**data, "text_column": "id"}, BYTE, str(tmp_path / "cache"), quiet=True)


@pytest.mark.parametrize("path, message", [
    # it was taken for a hub name: a lookup on the network, then the hub's error
    ("missing.jsonl", "'missing.jsonl' does not exist (a local file; a hub dataset is named without a suffix"),
    ("nowhere/*.jsonl", "'nowhere/*.jsonl' matches no file (a local file; a hub dataset is named without a suffix"),
    # the json builder's bare StopIteration
    ("empty.jsonl", "'empty.jsonl' holds no rows: the file is empty"),
])
def test_hf_local_files_that_are_not_there_or_empty_are_one_line(tmp_path, monkeypatch, path, message):
    monkeypatch.chdir(tmp_path)
    Path("empty.jsonl").write_text("")
    with pytest.raises(UserError) as e:
        prep.prepare({"kind": "hf", "path": path, "val_fraction": 0.1}, BYTE, str(tmp_path / "cache"), quiet=True)
    assert str(e.value).startswith(f"data.path: {message}")


def test_hf_rows_without_text_are_said_and_read_as_empty_documents(tmp_path, capsys):
    import datasets

    rows = [{"text": None if i in (3, 17) else f"document number {i} " * 20} for i in range(40)]
    datasets.Dataset.from_list(rows).to_json(tmp_path / "corpus.jsonl")
    data = {"kind": "hf", "path": str(tmp_path / "corpus.jsonl"), "val_fraction": 0.1}
    p = prep.prepare(data, BYTE, str(tmp_path / "cache"), quiet=True)
    assert p.meta["train"]["docs"] + p.meta["val"]["docs"] == 40
    assert p.meta["train"]["bytes"] + p.meta["val"]["bytes"] == sum(len(r["text"] or "") for r in rows)
    err = " ".join(capsys.readouterr().err.split())
    assert f"data: 2 of the 40 rows of '{tmp_path / 'corpus.jsonl'}' split 'train' have no text (null)" in err


def test_a_vocabulary_the_corpus_cannot_fill_is_said(tmp_path, capsys):
    """BPE stops merging where the corpus runs out of frequent pairs: the vocabulary is then
    smaller than tokenizer.vocab_size asks for, which is said, not left to the summary."""
    (tmp_path / "t.txt").write_text("the cat sat on the mat\n" * 30)
    data = {**TEXT, "paths": [str(tmp_path / "t.txt")]}
    p = prep.prepare(data, {"kind": "bpe", "vocab_size": 5000, "min_frequency": 2}, str(tmp_path / "c"), quiet=False)
    assert 257 < p.vocab_size < 300
    err = " ".join(capsys.readouterr().err.split())
    assert (f"tokenizer: the corpus gives {p.vocab_size} tokens, fewer than tokenizer.vocab_size=5,000 asks for: "
            "it has no more pairs seen at least tokenizer.min_frequency=2 times") in err


def test_a_tokenizer_that_encodes_the_corpus_to_nothing_is_named(tmp_path, corpus_dir):
    """A pretrained tokenizer with an empty vocabulary (and no EOS) makes no tokens of the text;
    the line said the documents held no text."""
    from tokenizers import Tokenizer, models

    Tokenizer(models.BPE()).save(str(tmp_path / "empty.json"))
    with pytest.raises(UserError, match=r"^data: the tokenizer encodes the corpus's \d+ documents \([\d,]+ bytes\) "
                                        r"to no tokens; check the tokenizer"):
        prep.prepare({**TEXT, "paths": [str(corpus_dir / "*")]},
                     {"kind": "pretrained", "path": str(tmp_path / "empty.json"), "eos": None},
                     str(tmp_path / "c"), quiet=True)


def test_pretrained_tokenizer_file_is_used_as_is(tmp_path, corpus_dir):
    data = {**TEXT, "paths": [str(corpus_dir / "*")]}
    bpe = prep.prepare(data, {"kind": "bpe", "vocab_size": 300, "min_frequency": 1}, str(tmp_path / "c"), quiet=True)
    again = prep.prepare(data, {"kind": "pretrained", "path": str(bpe.path / "tokenizer.json")},
                         str(tmp_path / "c"), quiet=True)
    assert again.path != bpe.path
    assert np.array_equal(np.asarray(again.tokens("train")), np.asarray(bpe.tokens("train")))
    with pytest.raises(UserError, match=r"^tokenizer.path: no tokenizer.json at"):
        prep.prepare(data, {"kind": "pretrained", "path": str(tmp_path / "none.json")}, str(tmp_path / "c"), quiet=True)


def test_a_literal_separator_in_the_text_ends_a_document_and_is_not_learned(tmp_path):
    """TinyStories-style text: documents separated by a literal <|endoftext|>. Each story is
    encoded as a document of its own (its tokens, then the separator id), and BPE training
    never sees the literal, so no merge of its pieces (``<|``, ``endoft``, ``|>``) is learned."""
    stories = [f"Once upon a time there was a cat number {i}. It liked fish and the sun.\n" for i in range(300)]
    (tmp_path / "stories.txt").write_text("<|endoftext|>".join(stories) + "<|endoftext|>", encoding="utf-8")
    data = {**TEXT, "paths": [str(tmp_path / "stories.txt")], "val_fraction": 0.1}
    p = prep.prepare(data, {"kind": "bpe", "vocab_size": 400, "min_frequency": 2}, str(tmp_path / "cache"), quiet=True)
    tok = p.tokenizer()
    learned = [t for t in tok.tok.get_vocab() if t != "<|endoftext|>"]
    assert not [t for t in learned if "<|" in t or "|>" in t or "endoft" in t or "oftext" in t]
    assert len(learned) > 300  # merges were learned, from the stories
    # the train split is the text's head (one file is split at a line); each of its stories
    # is its tokens and one separator: none is lost, none doubled by the literal
    corpus = CORPUS.get("text")(CORPUS.config(data, "data"))
    head = "".join(d.text for d in corpus.stream("train"))
    expected = [i for story in head.split("<|endoftext|>") if story for i in tok.encode(story) + [tok.eos_id]]
    assert np.asarray(p.tokens("train")).tolist() == expected
    assert head.count("<|endoftext|>") > 250


def test_files_keep_the_order_of_paths():
    """A corpus lists its files as plain strings (a Path object costs 3-4x the memory, at 10^5
    files that is most of the main process) in the order Path objects had, part by part, so
    the split, the cache key and the token stream are unchanged: ``a/b.py`` before ``a.b/c.py``."""
    from llmlab.data.corpus import path_order
    names = ["/a/b.py", "/a.b/c.py", "/a-b/x", "/a/b/c", "/a/b_c", "/ab/c"]
    assert sorted(names, key=path_order) == [str(p) for p in sorted(Path(n) for n in names)]
    assert sorted(names) != sorted(names, key=path_order)  # the plain string order differs here
    corpus = CORPUS.get("pysource")(CORPUS.config({"kind": "pysource"}, "data"))
    assert corpus.files() == [str(p) for p in sorted(Path(f) for f in corpus.files())]


def test_a_large_split_is_encoded_by_one_worker_per_core_unless_told(tmp_path):
    """``data.workers`` unset: a split under `SMALL_SPLIT` is encoded in this process, a larger
    one (or one of unknown size) by a worker per core; a set value is taken as it is."""
    import os

    from llmlab.data.build import SMALL_SPLIT, Builder

    class Sized:
        def __init__(self, size):
            self.sizes = size

        def size(self, split):
            return self.sizes

    def workers(size, setting=None):
        return Builder(Sized(size), None, tmp_path, setting, True, 1000, {}).workers_for("train")

    assert workers(SMALL_SPLIT - 1) == 0
    assert workers(SMALL_SPLIT) == workers(None) == (os.cpu_count() or 1)
    assert workers(SMALL_SPLIT * 4, setting=3) == 3
