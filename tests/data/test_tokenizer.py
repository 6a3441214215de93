import pytest

from llmlab.data.documents import pieces
from llmlab.data.tokenizer import EOS, TOKENIZER, TextTokenizer, byte_to_unicode

TEXTS = ["plain ASCII: def f(x): return x * 2\n", "Ünïcödé — ßtraße, naïve café, 日本語, Ελληνικά",
         "emoji 😀🚀👩‍👩‍👧 and a zero-width joiner", "\ttabs\n\n  and   spaces  \r\n"]


@pytest.fixture(scope="module")
def bpe() -> TextTokenizer:
    cfg = TOKENIZER.config({"kind": "bpe", "vocab_size": 400, "min_frequency": 1}, "tokenizer")
    corpus = [t * 20 for t in TEXTS]
    return TOKENIZER.build(cfg).make(lambda: iter(corpus))


@pytest.fixture(scope="module")
def byte() -> TextTokenizer:
    return TOKENIZER.build(TOKENIZER.config({"kind": "byte"}, "tokenizer")).make()


def test_byte_map_is_a_bijection_onto_printable_characters():
    m = byte_to_unicode()
    assert sorted(m) == list(range(256))
    assert len(set(m.values())) == 256
    assert all(c.isprintable() and not c.isspace() for c in m.values())


@pytest.mark.parametrize("text", TEXTS)
def test_byte_tokenizer_is_one_id_per_byte(byte, text):
    ids = byte.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert byte.decode(ids) == text
    assert byte.vocab_size == 257 and byte.eos_id == 256


@pytest.mark.parametrize("kind", ["bpe", "byte"])
@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(kind, text, bpe, byte):
    tok = {"bpe": bpe, "byte": byte}[kind]
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("kind", ["bpe", "byte"])
def test_special_token_is_kept_whole(kind, bpe, byte):
    tok = {"bpe": bpe, "byte": byte}[kind]
    ids = tok.encode(f"end of one{EOS}start of two")
    assert ids.count(tok.eos_id) == 1
    assert tok.decode(ids) == f"end of one{EOS}start of two"
    assert EOS not in tok.decode(ids, skip_special=True)


def test_bpe_learns_merges(bpe):
    text = TEXTS[0]
    assert len(bpe.encode(text)) < len(text.encode("utf-8")) / 2
    assert bpe.vocab_size <= 400


def test_save_and_load(tmp_path, bpe):
    bpe.save(tmp_path / "tokenizer.json")
    again = TextTokenizer.load(tmp_path / "tokenizer.json")
    assert again.encode(TEXTS[1]) == bpe.encode(TEXTS[1])
    assert again.eos_id == bpe.eos_id


def test_pieces_encode_exactly_like_the_whole(bpe):
    text = ("def f(x):\n\n    return x\n  \n\nclass A:\n    pass\n" * 300) + "tail"
    parts = pieces(text, size=100)
    assert len(parts) > 10 and "".join(parts) == text
    assert [i for p in bpe.encode_batch(parts) for i in p] == bpe.encode(text)
