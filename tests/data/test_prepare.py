import json

import numpy as np
import pytest

import llmlab.data.prepare as prep
from llmlab.data.corpus import CORPUS, Document, PythonSource, split_documents
from llmlab.data.shards import ShardWriter, read_shard, token_dtype
from llmlab.errors import UserError

TEXT = {"kind": "text", "val_fraction": 0.25}
BYTE = {"kind": "byte"}


def test_shard_write_read_round_trip(tmp_path):
    for dtype, top in ((np.uint16, 2**16 - 1), (np.uint32, 2**20)):
        with ShardWriter(tmp_path / "a.bin", dtype) as w:
            w.write([1, 2, 3])
            w.write(np.array([top, 0]))
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
    assert meta["train"]["docs"] == 3 and meta["val"]["docs"] == 1
    train = first.tokens("train")
    # byte tokenizer: tokens = bytes + one separator per document
    assert meta["train"]["tokens"] == meta["train"]["bytes"] + 3 == len(train)
    assert (np.asarray(train) == 256).sum() == 3
    assert (first.path / "tokenizer.json").is_file()

    again = prep.prepare(data, BYTE, str(tmp_path / "cache"), quiet=True)
    assert not again.built and again.path == first.path
    # a changed setting is a new entry
    other = prep.prepare({**data, "val_fraction": 0.5}, BYTE, str(tmp_path / "cache"), quiet=True)
    assert other.built and other.path != first.path


def test_a_failed_prepare_leaves_no_entry(tmp_path, corpus_dir, monkeypatch):
    data = {**TEXT, "paths": [str(corpus_dir / "*")]}

    def broken(*a, **k):
        raise KeyboardInterrupt  # as if the user pressed ^C halfway

    monkeypatch.setattr(prep, "_build", broken)
    with pytest.raises(KeyboardInterrupt):
        prep.prepare(data, BYTE, str(tmp_path / "cache"), quiet=True)
    assert list((tmp_path / "cache").iterdir()) == []


def test_changed_file_makes_a_new_entry(tmp_path, corpus_dir):
    data = {**TEXT, "paths": [str(corpus_dir / "*")]}
    first = prep.prepare(data, BYTE, str(tmp_path / "cache"), quiet=True)
    (corpus_dir / "alpha.py").write_text("changed\n" * 50)
    second = prep.prepare(data, BYTE, str(tmp_path / "cache"), quiet=True)
    assert second.path != first.path


def test_invalid_utf8_is_repaired_and_bytes_are_counted_honestly(tmp_path):
    raw = "caf\xe9 latin-1 text\n".encode("latin-1") * 40
    (tmp_path / "latin.txt").write_bytes(raw)
    p = prep.prepare({**TEXT, "paths": [str(tmp_path / "latin.txt")]}, BYTE, str(tmp_path / "cache"), quiet=True)
    assert p.meta["train"]["bytes"] + p.meta["val"]["bytes"] == len(raw)


def test_empty_corpus_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match=r"^data.paths: no files matched"):
        prep.prepare({**TEXT, "paths": [str(tmp_path / "nothing*.txt")]}, BYTE, str(tmp_path / "c"), quiet=True)


def test_split_is_deterministic_by_document():
    docs = [Document(f"f{i}.py", "x" * i, i) for i in range(100)]
    a = split_documents(docs, 0.1)
    b = split_documents(list(reversed(docs)), 0.1)
    assert [d.name for d in a.val] == [d.name for d in b.val]
    assert len(a.val) == 10 and len(a.train) == 90
    assert not {d.name for d in a.val} & {d.name for d in a.train}


def test_single_document_is_split_at_a_line():
    doc = Document("one.txt", "".join(f"line {i}\n" for i in range(100)), 0)
    doc.nbytes = len(doc.text.encode())
    s = split_documents([doc], 0.1)
    assert s.train[0].text + s.val[0].text == doc.text
    assert s.val[0].text.startswith("line ") and s.train[0].text.endswith("\n")
    assert s.train[0].nbytes + s.val[0].nbytes == doc.nbytes


def test_pysource_lists_stdlib_without_tests():
    corpus = PythonSource(CORPUS.config({"kind": "pysource"}, "data"))
    files = corpus.files()
    rel = [str(p.relative_to(corpus.root())) for p in files]
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
    assert p.meta["train"]["docs"] == 36 and p.meta["val"]["docs"] == 4
    total = sum(len(r["text"].encode()) for r in rows)
    assert p.meta["train"]["bytes"] + p.meta["val"]["bytes"] == total
    with pytest.raises(UserError, match=r"^data.text_column: 'body' is not a column; columns: text, id"):
        prep.prepare({**data, "text_column": "body"}, BYTE, str(tmp_path / "cache"), quiet=True)


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
    doc = Document("stories.txt", (tmp_path / "stories.txt").read_text(encoding="utf-8"), 0)
    head = split_documents([doc], 0.1).train[0].text
    expected = [i for story in head.split("<|endoftext|>") if story for i in tok.encode(story) + [tok.eos_id]]
    assert np.asarray(p.tokens("train")).tolist() == expected
    assert head.count("<|endoftext|>") > 250
