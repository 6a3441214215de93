"""The ``tokenizer=byte`` kind."""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from llmlab.data.tokenizer import EOS, TOKENIZER, TextTokenizer, TokenizerFactory, byte_to_unicode


@TOKENIZER.register("byte")
class ByteTokenizer(TokenizerFactory):
    """One id per byte (0-255) plus ``<|endoftext|>`` (256). Nothing to train."""

    @dataclass
    class Config:
        kind: str = "byte"

    def make(self, texts=None) -> TextTokenizer:
        vocab = {ch: b for b, ch in byte_to_unicode().items()}
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([EOS])
        return TextTokenizer(tok)
