"""A Llama-style decoder block, tensor-parallel, written once and run over any of the communication
modes of ``tp_comm`` (``"nccl"``, ``"torch_async_tp"``, ``"symmcoll"``, and ``"local"``: one rank, no
communication, the tests' oracle).

    x -> RMSNorm -> QKV (column-parallel) -> rotary, GQA attention, KV cache -> O (row-parallel)
      -> + x = h -> RMSNorm -> gate|up (column-parallel) -> SwiGLU -> down (row-parallel) -> + h

Sharding over W ranks (Megatron): rank r holds query heads [r*Hq/W, (r+1)*Hq/W) and the KV heads
they use (contiguous blocks keep the grouped-query mapping local), the same columns of gate and up,
and the matching rows of O and down. Norm weights are replicated. Weights are stored [in, out] (the
[K, N] that every mode's matmul takes) and drawn from one seed on every rank, full size, before
slicing: every mode and every world size sees the same model.

Two forms of the same block:
* ``decode(x, positions, cache)``: classic TP, activations [B, hidden] replicated on every rank; one
  token per sequence at ``positions`` [B]. Static shapes, no host synchronisation, the cache written
  in place: capturable in a CUDA graph (attention runs over the whole cache under a mask).
* ``prefill(x_shard, cache)``: sequence-parallel, activations are this rank's rows of the flattened
  [B*S, hidden] tokens (B*S divisible by W); the all-gathers sit in front of the column-parallel
  matmuls and the reduce-scatters after the row-parallel ones, so a fused op can take each pair.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from .layers import rms_norm, rotate, swiglu
from .tp_comm import make_comm


@dataclass(frozen=True)
class BlockConfig:
    hidden: int = 8192
    n_heads: int = 64
    n_kv_heads: int = 8
    head_dim: int = 128
    ffn: int = 28672
    rope_theta: float = 500000.0
    eps: float = 1e-5

    def check_shardable(self, world: int) -> None:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")
        for name in ("n_heads", "n_kv_heads", "ffn"):
            if getattr(self, name) % world:
                raise ValueError(f"{name}={getattr(self, name)} must be divisible by the world size {world}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even (rotary embeddings rotate pairs)")


LLAMA_70B = BlockConfig()


@dataclass
class BlockWeights:
    """One rank's shard of the block's weights (see the module docstring for the layout)."""

    attn_norm: torch.Tensor   # [hidden]
    w_qkv: torch.Tensor       # [hidden, (Hq/W + 2*Hkv/W) * head_dim]: q | k | v columns of local heads
    w_o: torch.Tensor         # [Hq/W * head_dim, hidden]
    ffn_norm: torch.Tensor    # [hidden]
    w_gate_up: torch.Tensor   # [hidden, 2 * ffn/W]: gate | up
    w_down: torch.Tensor      # [ffn/W, hidden]

    @classmethod
    def random(cls, config: BlockConfig, rank: int, world: int, *, seed: int = 0,
               dtype: torch.dtype = torch.bfloat16, device="cpu") -> BlockWeights:
        """Rank ``rank``'s shard of weights drawn from ``seed`` (the same full weights whatever the world
        size; values in ``dtype``). Matrices ~ N(0, 1/fan_in), norm weights ~ 1 + N(0, 0.1^2)."""
        config.check_shardable(world)
        c, device = config, torch.device(device)
        generator = torch.Generator(device=device).manual_seed(seed)

        def draw(*shape, scale):
            return torch.randn(*shape, generator=generator, device=device, dtype=torch.float32).mul_(scale)

        def cols(full, r):   # this rank's block of columns
            n = full.shape[1] // world
            return full[:, r * n:(r + 1) * n]

        def rows(full):
            n = full.shape[0] // world
            return full[rank * n:(rank + 1) * n]

        matrix_scale = lambda fan_in: fan_in ** -0.5  # noqa: E731 - keeps activations O(1)
        attn_norm = 1 + draw(c.hidden, scale=0.1)
        wq = draw(c.hidden, c.n_heads * c.head_dim, scale=matrix_scale(c.hidden))
        wk = draw(c.hidden, c.n_kv_heads * c.head_dim, scale=matrix_scale(c.hidden))
        wv = draw(c.hidden, c.n_kv_heads * c.head_dim, scale=matrix_scale(c.hidden))
        w_qkv = torch.cat([cols(wq, rank), cols(wk, rank), cols(wv, rank)], dim=1)
        del wq, wk, wv
        w_o = rows(draw(c.n_heads * c.head_dim, c.hidden, scale=matrix_scale(c.n_heads * c.head_dim)))
        ffn_norm = 1 + draw(c.hidden, scale=0.1)
        w_gate = cols(draw(c.hidden, c.ffn, scale=matrix_scale(c.hidden)), rank)
        w_up = cols(draw(c.hidden, c.ffn, scale=matrix_scale(c.hidden)), rank)
        w_gate_up = torch.cat([w_gate, w_up], dim=1)
        del w_gate, w_up
        w_down = rows(draw(c.ffn, c.hidden, scale=matrix_scale(c.ffn)))
        return cls(*(t.to(dtype).contiguous() for t in (attn_norm, w_qkv, w_o, ffn_norm, w_gate_up, w_down)))

    def to(self, dtype: torch.dtype) -> BlockWeights:
        return BlockWeights(*(getattr(self, f.name).to(dtype) for f in fields(self)))


@dataclass
class KVCache:
    """This rank's KV heads for ``batch`` sequences of up to ``max_seq`` tokens: k, v [B, Hkv/W, max_seq, D]."""

    k: torch.Tensor
    v: torch.Tensor

    @classmethod
    def empty(cls, config: BlockConfig, world: int, batch: int, max_seq: int, *,
              dtype: torch.dtype = torch.bfloat16, device="cpu") -> KVCache:
        shape = (batch, config.n_kv_heads // world, max_seq, config.head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    @property
    def batch(self) -> int:
        return self.k.shape[0]

    @property
    def max_seq(self) -> int:
        return self.k.shape[2]

    def fill_random(self, rank: int, world: int, length: int, *, seed: int = 1) -> KVCache:
        """Positions [0, length) of every sequence: this rank's heads of keys and values drawn from
        ``seed`` for all heads (the same cache on every mode and world size), as if prefilled."""
        batch, local_heads, _, head_dim = self.k.shape
        generator = torch.Generator(device=self.k.device).manual_seed(seed)
        for buf in (self.k, self.v):
            full = torch.randn(batch, local_heads * world, length, head_dim, generator=generator,
                               device=self.k.device, dtype=torch.float32)
            buf[:, :, :length] = full[:, rank * local_heads:(rank + 1) * local_heads]
        return self


class DecoderBlock(torch.nn.Module):
    """One tensor-parallel decoder block over ``mode``'s communication (``tp_comm.MODES``).

    algorithms: for mode "symmcoll", op name -> ``algorithm=`` (default "auto" for every op)."""

    def __init__(self, config: BlockConfig, weights: BlockWeights, mode: str, group=None, *,
                 algorithms: dict[str, str] | None = None):
        super().__init__()
        self.config, self.mode = config, mode
        self.comm = make_comm(mode, group, algorithms)
        world = self.comm.world
        config.check_shardable(world)
        self.q_heads, self.kv_heads = config.n_heads // world, config.n_kv_heads // world
        expected = config.hidden, (self.q_heads + 2 * self.kv_heads) * config.head_dim
        if tuple(weights.w_qkv.shape) != expected:
            raise ValueError(f"weights: w_qkv is {tuple(weights.w_qkv.shape)}, want {expected} for world "
                             f"size {world} (weights drawn for another world size or config?)")
        for f in fields(weights):
            self.register_buffer(f.name, getattr(weights, f.name), persistent=False)
        half = torch.arange(0, config.head_dim, 2, dtype=torch.float32, device=weights.w_qkv.device)
        self.register_buffer("inv_freq", config.rope_theta ** (-half / config.head_dim), persistent=False)

    # ---- the two forms ----------------------------------------------------------------------------

    def decode(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One token per sequence, classic TP. x [B, hidden] (the same on every rank), positions [B]
        int64 (where each token goes in the cache; attends to cache positions <= it). Returns [B, hidden]."""
        c = self.config
        qkv = rms_norm(x, self.attn_norm, c.eps) @ self.w_qkv
        attn = self._decode_attention(qkv, positions, cache)
        normed, h = self.comm.all_reduce_rms_norm(attn @ self.w_o, x, self.ffn_norm, c.eps)
        return h + self.comm.matmul_all_reduce(swiglu(normed @ self.w_gate_up), self.w_down)

    def prefill(self, x_shard: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Sequence-parallel prefill of ``cache.batch`` sequences from position 0. x_shard: this rank's
        rows [B*S/W, hidden] of the tokens [B*S, hidden] (sequence-major). Fills cache positions [0, S);
        returns this rank's rows of the block's output."""
        c, world = self.config, self.comm.world
        tokens = x_shard.shape[0] * world
        if tokens % cache.batch or tokens // cache.batch > cache.max_seq:
            raise ValueError(f"x_shard: {x_shard.shape[0]} rows x {world} ranks is not batch {cache.batch} "
                             f"x at most {cache.max_seq} tokens")
        qkv = self.comm.gather_matmul(rms_norm(x_shard, self.attn_norm, c.eps), self.w_qkv)
        attn = self._prefill_attention(qkv, cache.batch, tokens // cache.batch, cache)
        h = x_shard + self.comm.matmul_scatter(attn, self.w_o)
        gate_up = self.comm.gather_matmul(rms_norm(h, self.ffn_norm, c.eps), self.w_gate_up)
        return h + self.comm.matmul_scatter(swiglu(gate_up), self.w_down)

    # ---- attention --------------------------------------------------------------------------------

    def _split_heads(self, qkv: torch.Tensor):
        d = self.config.head_dim
        q, k, v = qkv.split([self.q_heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
        lead = qkv.shape[:-1]
        return q.view(*lead, self.q_heads, d), k.view(*lead, self.kv_heads, d), v.view(*lead, self.kv_heads, d)

    def _angles(self, positions: torch.Tensor):
        angles = positions.to(torch.float32)[..., None] * self.inv_freq
        return angles.cos(), angles.sin()

    def _prefill_attention(self, qkv, batch: int, seq: int, cache: KVCache) -> torch.Tensor:
        q, k, v = self._split_heads(qkv.view(batch, seq, -1))                  # [B, S, heads, D]
        cos, sin = self._angles(torch.arange(seq, device=qkv.device))
        cos, sin = cos[:, None, :], sin[:, None, :]                             # over heads
        q, k = rotate(q, cos, sin).transpose(1, 2), rotate(k, cos, sin).transpose(1, 2)
        v = v.transpose(1, 2)                                                   # [B, heads, S, D]
        cache.k[:, :, :seq] = k
        cache.v[:, :, :seq] = v
        # KV heads repeated for their query heads: plain causal attention, which flash attention takes
        # on every torch version (the copy is small next to the attention itself).
        group = self.q_heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).reshape(batch * seq, self.q_heads * self.config.head_dim)

    def _decode_attention(self, qkv, positions: torch.Tensor, cache: KVCache) -> torch.Tensor:
        q, k, v = self._split_heads(qkv)                                        # [B, heads, D]
        cos, sin = self._angles(positions)
        cos, sin = cos[:, None, :], sin[:, None, :]
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        sequences = torch.arange(q.shape[0], device=q.device)
        cache.k[sequences, :, positions] = k                                    # index_put: graph-safe
        cache.v[sequences, :, positions] = v
        # Attend over the whole (static) cache; a mask keeps each sequence to its positions <= its own.
        # The query heads sharing a KV head take the place of query positions ([B, kv, group, D]): the
        # cache is read as it is, never repeated per query head.
        visible = torch.arange(cache.max_seq, device=q.device)[None, :] <= positions[:, None]
        batch, group = q.shape[0], self.q_heads // self.kv_heads
        out = F.scaled_dot_product_attention(q.view(batch, self.kv_heads, group, -1), cache.k, cache.v,
                                             attn_mask=visible[:, None, None, :])
        return out.reshape(batch, self.q_heads * self.config.head_dim)


__all__ = ["BlockConfig", "LLAMA_70B", "BlockWeights", "KVCache", "DecoderBlock"]
