"""The sharded token store: the same tokens whatever the workers and shard size, a killed
build that continues to byte-identical shards, windows drawn across shards with exact resume,
and offsets past 2^32."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import llmlab.data.build as build
import llmlab.data.prepare as prep
from llmlab.data.batches import RandomWindows
from llmlab.data.shards import TokenStore, read_shard
from llmlab.errors import UserError

BPE = {"kind": "bpe", "vocab_size": 320}


def write_docs(root, n=40, repeat=30):
    d = root / "docs"
    d.mkdir()
    for i in range(n):
        (d / f"{i:03d}.py").write_text(f"def function_{i}(x):\n    return x + {i}  # note {i % 5}\n" * (repeat + i))
    return {"kind": "text", "paths": [str(d / "*.py")], "val_fraction": 0.2}


def all_tokens(p, split="train"):
    return np.asarray(p.tokens(split)).tolist()


def shard_bytes(p, split="train"):
    return [(p.path / split / s["file"]).read_bytes() for s in p.meta[split]["shards"]]


def test_the_tokens_do_not_depend_on_workers_or_shard_size(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "BATCH_CHARS", 2000)  # many batches, so workers interleave
    data = write_docs(tmp_path)
    one = prep.prepare({**data, "workers": 1}, BPE, str(tmp_path / "c1"), quiet=True)
    two = prep.prepare({**data, "workers": 2, "shard_tokens": 700}, BPE, str(tmp_path / "c2"), quiet=True)
    assert one.path.name == two.path.name  # workers and shard size are not part of the key
    assert len(one.meta["train"]["shards"]) == 1 and len(two.meta["train"]["shards"]) > 3
    for split in ("train", "val"):
        assert all_tokens(one, split) == all_tokens(two, split)
        assert b"".join(shard_bytes(one, split)) == b"".join(shard_bytes(two, split))
    index = two.meta["train"]
    assert sum(s["tokens"] for s in index["shards"]) == index["tokens"] == len(two.tokens("train"))
    assert sum(s["docs"] for s in index["shards"]) == index["docs"]
    assert sum(s["bytes"] for s in index["shards"]) == index["bytes"]
    assert all(s["tokens"] >= 700 for s in index["shards"][:-1])  # closed at the first batch past the size


KILLER = textwrap.dedent("""
    import os, signal, sys
    import llmlab.data.build as build
    import llmlab.data.shards as shards
    import llmlab.data.prepare as prep
    build.BATCH_CHARS = 2000
    writes = [0]
    write = shards.SplitWriter.write
    def write_then_die(self, *args):
        write(self, *args)
        writes[0] += 1
        if len(self.shards) == 2 and self.writer is not None and self.writer.count > 0:
            os.kill(os.getpid(), signal.SIGKILL)  # kill -9 in the middle of the third shard
    shards.SplitWriter.write = write_then_die
    prep.prepare({data!r}, {tok!r}, {cache!r}, quiet=True)
""")


def test_a_build_killed_mid_shard_continues_to_byte_identical_shards(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "BATCH_CHARS", 2000)
    data = {**write_docs(tmp_path), "workers": 1, "shard_tokens": 700}
    cache = tmp_path / "cache"
    script = KILLER.format(data=data, tok=BPE, cache=str(cache))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL, done.stderr
    partial = next(cache.glob(".partial-*"))
    progress = json.loads((partial / "progress.json").read_text())
    assert len(progress["splits"]["train"]["shards"]) == 2 and list((partial / "train").glob(".*.tmp"))

    resumed = prep.prepare(data, BPE, str(cache))  # not quiet: it says what it continues
    clean = prep.prepare(data, BPE, str(tmp_path / "clean"), quiet=True)
    assert resumed.built and not list(cache.glob(".partial-*"))
    for split in ("train", "val"):
        assert shard_bytes(resumed, split) == shard_bytes(clean, split)
    assert resumed.meta["train"] == clean.meta["train"] and resumed.meta["val"] == clean.meta["val"]
    assert not list((resumed.path / "train").glob(".*"))  # no temporary shard left behind


def test_windows_are_drawn_across_shards_and_resume_exactly(tmp_path):
    rng = np.random.default_rng(0)
    arrays = []
    for i, n in enumerate([50, 7, 120, 33]):
        path = tmp_path / f"{i}.bin"
        rng.integers(0, 1000, n).astype(np.uint16).tofile(path)
        arrays.append(read_shard(path, np.uint16))
    store, whole = TokenStore(arrays), np.concatenate([np.asarray(a) for a in arrays])
    assert len(store) == len(whole) == 210
    for start in range(0, 200):
        assert store[start:start + 11].tolist() == whole[start:start + 11].tolist()
    assert store[-1] == whole[-1] and store[57:57].size == 0

    a = RandomWindows(store, 10, 4, seed=3)
    b = RandomWindows(whole, 10, 4, seed=3)
    for _ in range(30):  # the same windows as over one array, crossing shard edges
        assert a.next_window().tolist() == b.next_window().tolist()
    state = json.loads(json.dumps(a.state_dict()))
    expected = [a.next_window().tolist() for _ in range(5)]
    c = RandomWindows(store, 10, 4, seed=99)
    c.load_state_dict(state)
    assert [c.next_window().tolist() for _ in range(5)] == expected


def test_more_than_2_to_the_32_tokens(tmp_path):
    """Three sparse shards of 2^31 + 5 uint16 tokens each (12 GiB, no blocks on disk): offsets,
    slices over the edges and window draws work past 2^32."""
    n = 2**31 + 5
    arrays = []
    for i in range(3):
        path = tmp_path / f"{i}.bin"
        with open(path, "wb") as f:
            f.truncate(n * 2)
            f.seek((n - 3) * 2)
            f.write(np.array([7 + i, 8 + i, 9 + i], dtype=np.uint16).tobytes())
        arrays.append(read_shard(path, np.uint16))
    store = TokenStore(arrays)
    assert len(store) == 3 * n > 2**32
    assert store[n - 3:n + 2].tolist() == [7, 8, 9, 0, 0]
    assert store[2 * n - 3:2 * n + 2].tolist() == [8, 9, 10, 0, 0]  # an edge past 2^32
    assert store[3 * n - 3:].tolist() == [9, 10, 11] and store[3 * n - 1] == 11
    windows = RandomWindows(store, 8, 64, seed=0)
    state = windows.state_dict()
    starts = windows.rng.integers(0, len(store) - 8, size=64)
    assert (starts > 2**32).sum() > 10  # int64 starts over the whole store
    windows.load_state_dict(state)
    got = windows.next_window().numpy()
    assert got.shape == (64, 9)
    for row, start in zip(got, starts):
        assert row.tolist() == store[start:start + 9].tolist()


def test_an_entry_from_before_shards_is_still_read(tmp_path):
    entry = tmp_path / "cache" / "text-byte-0123456789ab"
    entry.mkdir(parents=True)
    np.arange(300, dtype=np.uint16).tofile(entry / "train.bin")
    np.arange(50, dtype=np.uint16).tofile(entry / "val.bin")
    meta = {"version": 2, "vocab_size": 257, "dtype": "uint16", "eos": "<|endoftext|>", "eos_id": 256,
            "train": {"tokens": 300, "bytes": 300, "docs": 3}, "val": {"tokens": 50, "bytes": 50, "docs": 1},
            "timings": {"read_s": 0.1, "tokenizer_s": 0.0, "encode_s": 0.1, "total_s": 0.2}}
    (entry / "meta.json").write_text(json.dumps(meta))
    p = prep.Prepared(entry, prep.read_meta(entry))
    assert np.asarray(p.tokens("train")).tolist() == list(range(300)) and len(p.tokens("val")) == 50
    assert p.token_counts("val")[:50].tolist() == [1] * 50
    prep.print_summary(p)  # its older timings print too


def test_two_builders_of_one_entry_share_the_work(tmp_path):
    """A second process asking for an entry being built waits for the first and uses its entry."""
    data = write_docs(tmp_path, n=30, repeat=200)
    cache = tmp_path / "cache"
    code = f"import llmlab.data.prepare as p; e = p.prepare({data!r}, {BPE!r}, {str(cache)!r}); print('BUILT', e.built)"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "COLUMNS": "200"}) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    built = sorted(o.split("BUILT ")[1].strip() for o, _ in outs)
    assert built == ["False", "True"]  # one built it, the other waited and read it
    assert len(list(cache.iterdir())) == 1


def test_the_tokenizer_learns_from_a_fixed_sample_within_its_budget(tmp_path, capsys):
    data = write_docs(tmp_path, n=60)
    full = prep.prepare(data, BPE, str(tmp_path / "full"))
    size = full.meta["tokenizer_sample"]["of"]
    budget = size // 3
    a = prep.prepare(data, {**BPE, "train_bytes": budget}, str(tmp_path / "a"))
    b = prep.prepare(data, {**BPE, "train_bytes": budget}, str(tmp_path / "b"), quiet=True)
    used = a.meta["tokenizer_sample"]["bytes"]
    assert full.meta["tokenizer_sample"]["bytes"] == size  # no budget reached: all of the train split
    # a hash sample of about budget / size of the documents, cut at the first one past the budget
    assert budget / 2 < used < budget + 5000
    assert (a.path / "tokenizer.json").read_text() == (b.path / "tokenizer.json").read_text()  # a fixed sample
    assert (a.path / "tokenizer.json").read_text() != (full.path / "tokenizer.json").read_text()
    assert f"on {used / 1e6:,.1f} MB of {size / 1e6:,.1f} MB" in capsys.readouterr().out


class Stage:
    """A progress stage that adds up what it was told."""
    done = 0

    def update(self, nbytes, tokens=0, final=False):
        self.done += nbytes


class KilledWhileTraining:
    """A tokenizer factory whose training process is killed, as the kernel's OOM killer would."""

    def train_bytes(self):
        return None

    def make(self, texts):
        os.kill(os.getpid(), signal.SIGKILL)


def test_a_tokenizer_trained_in_a_child_process_is_the_one_trained_here(tmp_path):
    """A corpus that is not small trains its tokenizer in a spawned child, whose memory goes
    back to the system when it ends: the same vocabulary and merges, the same sample, and
    the parent's progress follows the bytes the child read."""
    from llmlab.data.corpus import CORPUS
    from llmlab.data.tokenizer import TOKENIZER
    from llmlab.data.train_tokenizer import train_tokenizer

    rows = tmp_path / "rows.jsonl"  # a datasets corpus reaches the child too (pickled, reopened there)
    rows.write_text("".join(json.dumps({"text": f"def f{i}(x):\n    return x * {i}\n" * 30}) + "\n" for i in range(300)))
    factory = TOKENIZER.build(TOKENIZER.config({**BPE, "train_bytes": 40_000}, "tokenizer"))
    for data in (write_docs(tmp_path, n=60), {"kind": "hf", "path": str(rows)}):
        corpus = CORPUS.build(CORPUS.config(data, "data"))
        results = {}
        for in_child in (False, True):
            stage = Stage()
            tok, used = train_tokenizer(corpus, factory, stage, in_child=in_child)
            results[in_child] = (tok.tok.to_str(), tok.eos_id, used)
            assert stage.done == used["bytes"] and 20_000 < used["bytes"] < 50_000, (data["kind"], in_child, used)
        assert results[True] == results[False], data["kind"]
    # a child killed while training (out of memory) is one line that says what bounds its memory
    with pytest.raises(UserError, match=r"^tokenizer: the process training it ended abruptly .*tokenizer.train_bytes"):
        train_tokenizer(corpus, KilledWhileTraining(), Stage(), in_child=True)


def test_a_resume_between_the_parts_of_a_document_keeps_its_separators():
    """A shard may end between two parts of one document; the next part may start with a
    literal separator, which ends the text before it only if the resume knows text was open."""
    from llmlab.data.documents import Document

    items = [Document("a", "xx", 2, end=False), Document("a", "<|endoftext|>yy", 15, end=False),
             Document("a", "zz<|endoftext|>", 15, end=True), Document("b", "w", 1)]

    def flat(bs):
        return [(t, e) for b in bs for t, e in zip(b.texts, b.ends)]

    whole = list(build.batches(iter(items), "<|endoftext|>", batch_chars=1))
    assert flat(whole) == [("xx", False), ("", True), ("yy", False), ("zz", True), ("w", True)]  # "": the separator alone
    for cut in range(1, len(items)):  # resumed after each batch, from what its shard recorded
        first = whole[cut - 1]
        rest = build.batches(iter(items[first.position:]), "<|endoftext|>", first.position, 1, first.open_text)
        assert flat(whole[:cut]) + flat(rest) == flat(whole)


@pytest.mark.parametrize("name", ["../../../x", "/etc/passwd", "000001.bin", "0\x0000000.bin", 7, None])
def test_meta_json_names_only_the_entrys_own_shards(tmp_path, name):
    """A shard's name in meta.json is followed only when it is the name the builder gives that
    shard: a path out of the entry, another shard's name, a NUL byte or a non-string is one
    line naming meta.json, and nothing outside the entry is opened."""
    entry = tmp_path / "cache" / "text-byte-0123456789ab"
    (entry / "train").mkdir(parents=True)
    (tmp_path / "x").write_bytes(np.arange(10, dtype=np.uint16).tobytes())  # what ../../../x reaches
    np.arange(10, dtype=np.uint16).tofile(entry / "train" / "000000.bin")
    meta = {"version": 3, "vocab_size": 257, "dtype": "uint16", "layout": "shards", "eos": "<|endoftext|>",
            "train": {"tokens": 10, "bytes": 10, "docs": 1,
                      "shards": [{"file": name, "tokens": 10, "bytes": 10, "docs": 1}]},
            "val": {"tokens": 0, "bytes": 0, "docs": 0, "shards": []}}
    (entry / "meta.json").write_text(json.dumps(meta))
    p = prep.Prepared(entry, prep.read_meta(entry))
    with pytest.raises(UserError, match=r"damaged meta.json \(shard 0 is named .*, not '000000.bin'\)"):
        p.tokens("train")
    meta["train"]["shards"][0]["file"] = "000000.bin"
    (entry / "meta.json").write_text(json.dumps(meta))
    assert np.asarray(prep.Prepared(entry, prep.read_meta(entry)).tokens("train")).tolist() == list(range(10))
