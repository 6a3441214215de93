"""The ``tokenizer=bpe`` kind."""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from llmlab.data.tokenizer import EOS, TOKENIZER, TextTokenizer, TokenizerFactory, long_run_splitter
from llmlab.errors import ConfigError
from llmlab.registry import Checked, bounded


@TOKENIZER.register("bpe")
class ByteLevelBPE(TokenizerFactory):
    """Byte-level BPE (Radford et al. 2019, GPT-2, section 2.2) trained on the train split,
    with GPT-2 pre-tokenization and ``<|endoftext|>`` as the one special token."""

    @staticmethod
    def planned_vocab(cfg) -> int:
        return cfg.vocab_size

    @dataclass
    class Config(Checked):
        kind: str = "bpe"
        vocab_size: int = 8192
        min_frequency: int = bounded(2, at_least=0)  # a pair seen fewer times is not merged
        train_bytes: int = 256_000_000  # text it learns from: a fixed sample of the train split, by document hash

        def check(self, prefix: str) -> None:
            if not 257 <= self.vocab_size <= 2**32 - 1:
                raise ConfigError(f"{prefix}.vocab_size: must be in [257, 2^32), got {self.vocab_size}")
            if self.train_bytes < 1:
                raise ConfigError(f"{prefix}.train_bytes: must be >= 1, got {self.train_bytes}")

    def train_bytes(self) -> int | None:
        return self.cfg.train_bytes

    def needs_training(self) -> bool:
        return True

    def make(self, texts=None) -> TextTokenizer:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.Sequence([long_run_splitter(), pre_tokenizers.ByteLevel(add_prefix_space=False)])
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=self.cfg.vocab_size, min_frequency=self.cfg.min_frequency, special_tokens=[EOS],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator(texts(), trainer=trainer)
        return TextTokenizer(tok)
