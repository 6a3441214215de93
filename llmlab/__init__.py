"""llmlab: train, compare and sample small transformer language models."""

__version__ = "0.1.0"
