"""Key/value caches for incremental decoding."""

from __future__ import annotations

import torch


def cache_dtype(param_dtype: torch.dtype, device_type: str, autocast_dtype: torch.dtype | None) -> torch.dtype:
    """The dtype decoding keeps keys and values (and a latent, an indexer's keys) in.

    Under autocast on a GPU, autocast's: keys and values come out of the projections in it,
    and the cache takes half the memory of fp32's. Under CPU autocast, the parameters' (fp32):
    attention's scores are computed in fp32 there (`llmlab.model.attention.fused_sdpa`), and a
    bf16 cache made every decoding step either cast all of it up to fp32 or run PyTorch's bf16
    CPU kernel, whose cost grew with the context (a d 512, 8-layer token on 2 AVX-512 BF16
    cores: 5.8 ms at the first position, 7.0 ms at the 300th; 5.9 and 6.0 with an fp32 cache).
    An fp32 cache also holds exactly the keys and values the full forward attends to (the
    normed latents of mla, qk-norm's keys), where a bf16 one rounded them. Without autocast,
    the parameters' dtype."""
    if autocast_dtype is None or device_type == "cpu":
        return param_dtype
    return autocast_dtype


class KVCache:
    """Keys and values of one attention layer, preallocated: (B, H_kv, max_len, D)."""

    def __init__(self, batch: int, kv_heads: int, max_len: int, k_dim: int, v_dim: int,
                 device: torch.device, dtype: torch.dtype):
        self.k = torch.zeros(batch, kv_heads, max_len, k_dim, device=device, dtype=dtype)
        self.v = torch.zeros(batch, kv_heads, max_len, v_dim, device=device, dtype=dtype)
        self.positions = torch.arange(max_len, device=device)  # sliced, not made, at each step
        self.length = 0
        # a CUDA graph's token (`llmlab.sample.graphs`): the position it writes, held on the
        # device (1,), so one recorded step serves every position; None: the position is `length`
        self.at: torch.Tensor | None = None

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store new keys/values (B, H_kv, T, D); return all keys, values and their positions.
        With ``at`` set, one token is stored there and the whole buffer comes back, every
        position: the slots after ``at`` hold stale or zero keys, which a query must not see
        (`visible`; a causal mask of the positions hides them too)."""
        if self.at is not None:
            self.k.index_copy_(2, self.at, k)
            self.v.index_copy_(2, self.at, v)
            return self.k, self.v, self.positions
        start, end = self.length, self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; asked for {end}")
        self.k.narrow(2, start, end - start).copy_(k)  # narrow and copy_: fewer operations than slicing
        self.v.narrow(2, start, end - start).copy_(v)
        self.length = end
        return self.k.narrow(2, 0, end), self.v.narrow(2, 0, end), self.positions.narrow(0, 0, end)

    def visible(self) -> torch.Tensor | None:
        """With ``at`` set, which of the buffer's positions a token at ``at`` may look at
        (1, max_len), for one query; None: all that `append` returned."""
        return None if self.at is None else (self.positions <= self.at)[None]

    def truncate(self, length: int) -> None:
        """Forget every position from ``length`` on (rejected speculative tokens)."""
        self.length = min(self.length, length)


class RollingKVCache:
    """Keys and values of the last ``window`` positions: a ring buffer, so decoding memory
    stays bounded however long the text grows. (B, H_kv, window + slack, D).

    ``slack`` extra slots keep the positions that a `truncate` by up to ``slack`` positions
    needs back in view (speculative decoding rolls back rejected tokens)."""

    def __init__(self, batch: int, kv_heads: int, window: int, k_dim: int, v_dim: int,
                 device: torch.device, dtype: torch.dtype, slack: int = 0):
        size = window + slack
        self.k = torch.zeros(batch, kv_heads, size, k_dim, device=device, dtype=dtype)
        self.v = torch.zeros(batch, kv_heads, size, v_dim, device=device, dtype=dtype)
        self.slot_pos = torch.full((size,), -1, dtype=torch.long, device=device)  # -1: empty
        self.length = 0

    def truncate(self, length: int) -> None:
        self.slot_pos[self.slot_pos >= length] = -1
        self.length = min(self.length, length)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return the buffered keys/values followed by the new ones (the attention mask sorts out
        which each query may see), then keep the last ``window`` of them."""
        window, T = self.k.shape[2], k.shape[2]
        k, v = k.to(self.k.dtype), v.to(self.v.dtype)  # under autocast they may come in another dtype
        new_pos = torch.arange(self.length, self.length + T, device=k.device)
        filled = self.slot_pos >= 0
        keys = torch.cat([self.k[:, :, filled], k], dim=2)
        values = torch.cat([self.v[:, :, filled], v], dim=2)
        positions = torch.cat([self.slot_pos[filled], new_pos])
        keep = min(T, window)
        slots = new_pos[-keep:] % window
        self.k[:, :, slots] = k[:, :, -keep:]
        self.v[:, :, slots] = v[:, :, -keep:]
        self.slot_pos[slots] = new_pos[-keep:]
        self.length += T
        return keys, values, positions


class LatentCache:
    """MLA's cache: the compressed latent (B, max_len, kv_rank) and the one shared rotary key
    (B, 1, max_len, rope_dim) per position; keys and values are rebuilt from them."""

    def __init__(self, batch: int, max_len: int, kv_rank: int, rope_dim: int, device: torch.device,
                 dtype: torch.dtype):
        self.latent = torch.zeros(batch, max_len, kv_rank, device=device, dtype=dtype)
        self.k_rope = torch.zeros(batch, 1, max_len, rope_dim, device=device, dtype=dtype)
        self.positions = torch.arange(max_len, device=device)
        self.length = 0

    def append(self, latent: torch.Tensor, k_rope: torch.Tensor):
        start, end = self.length, self.length + latent.shape[1]
        if end > self.latent.shape[1]:
            raise ValueError(f"latent cache holds {self.latent.shape[1]} positions; asked for {end}")
        self.latent[:, start:end] = latent
        self.k_rope[:, :, start:end] = k_rope
        self.length = end
        return self.latent[:, :end], self.k_rope[:, :, :end], self.positions[:end]

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)


class IndexedCache:
    """A sparse kind's cache (dsa): its base attention's cache and, beside it, the indexer's
    key per position (B, max_len, index_dim)."""

    def __init__(self, base, batch: int, max_len: int, dim: int, device: torch.device, dtype: torch.dtype):
        self.base = base
        self.keys = torch.zeros(batch, max_len, dim, device=device, dtype=dtype)
        self.positions = torch.arange(max_len, device=device)
        self.length = 0

    def append(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store new index keys (B, T, dim); return all of them and their positions."""
        start, end = self.length, self.length + keys.shape[1]
        if end > self.keys.shape[1]:
            raise ValueError(f"index cache holds {self.keys.shape[1]} positions; asked for {end}")
        self.keys[:, start:end] = keys
        self.length = end
        return self.keys[:, :end], self.positions[:end]

    def truncate(self, length: int) -> None:
        self.base.truncate(length)
        self.length = min(self.length, length)


def cache_tensors(layer) -> list[torch.Tensor]:
    """The tensors a layer's cache holds, those of a cache inside it included (not the
    ``positions`` 0..max_len-1 that a cache hands out slices of)."""
    out = []
    for name, value in vars(layer).items():
        if isinstance(value, torch.Tensor) and name != "positions":
            out.append(value)
        elif hasattr(value, "truncate"):
            out.extend(cache_tensors(value))
    return out


class ModelCache:
    """One cache per layer plus the next position to write."""

    def __init__(self, layers: list):
        self.layers = layers
        self.pos = 0

    def truncate(self, length: int) -> None:
        """Drop every position from ``length`` on, in every layer."""
        for layer in self.layers:
            layer.truncate(length)
        self.pos = min(self.pos, length)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.layers for t in cache_tensors(layer))
