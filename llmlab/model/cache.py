"""Key/value caches for incremental decoding."""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values of one attention layer, preallocated: (B, H_kv, max_len, D)."""

    def __init__(self, batch: int, kv_heads: int, max_len: int, k_dim: int, v_dim: int,
                 device: torch.device, dtype: torch.dtype):
        self.k = torch.zeros(batch, kv_heads, max_len, k_dim, device=device, dtype=dtype)
        self.v = torch.zeros(batch, kv_heads, max_len, v_dim, device=device, dtype=dtype)
        self.length = 0

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store new keys/values (B, H_kv, T, D); return all keys, values and their positions."""
        start, end = self.length, self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; asked for {end}")
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        self.length = end
        positions = torch.arange(end, device=k.device)
        return self.k[:, :, :end], self.v[:, :, :end], positions


class ModelCache:
    """One cache per layer plus the next position to write."""

    def __init__(self, layers: list):
        self.layers = layers
        self.pos = 0

    def nbytes(self) -> int:
        total = 0
        for layer in self.layers:
            for t in vars(layer).values():
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
        return total
