"""A Llama-3-style decoder block as torchtitan writes it, made tensor-parallel by torch's own
``parallelize_module`` plans (DTensor). Nothing here imports symmcoll: it is the model a user of
torch.distributed already has, the client that ``symmcoll.backend`` must serve unchanged (the tests
compile it with ``torch.compile(block, backend=symmcoll.backend(...))``; ``symmcoll bench --op
backend_block`` times that against the same block compiled plainly).

torchtitan's layout: module names (attention.wq/wk/wv/wo, feed_forward.w1/w2/w3, attention_norm,
ffn_norm), GQA by repeating KV heads, SwiGLU, ``nn.RMSNorm``, rotary embeddings (interleaved pairs).
torchtitan trains and has no KV cache; for decoding, ``KVCache`` adds a static cache in the style of
gpt-fast (torch's compiled-decode example): written in place at ``input_pos``, attended under a mask,
shapes fixed, so ``mode="reduce-overhead"`` can capture a decode step.

Tensor parallelism (``parallelize``): column-parallel q/k/v and w1/w3, row-parallel wo and w2; with
sequence parallelism the norms run on sequence shards (dim 1) and the attention / feed-forward inputs
are gathered. Local head counts are inferred from the sharded weights (the -1 in ``Attention.forward``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ModelArgs:
    dim: int = 64
    n_heads: int = 8
    n_kv_heads: int = 4
    ffn_dim: int = 128
    max_seq_len: int = 16
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0


# One layer of Llama-3-70B (torchtitan's "70B" flavour: hidden 8192, 64 query / 8 KV heads of 128,
# feed-forward 28672); rotary tables long enough for the benchmark's 4096-token prefill.
LLAMA3_70B = ModelArgs(dim=8192, n_heads=64, n_kv_heads=8, ffn_dim=28672, max_seq_len=4096, rope_theta=500000.0)


def rotary_tables(head_dim: int, seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), freqs)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [bs, seq, heads, head_dim], cos/sin [seq, head_dim / 2] (the tokens' positions): rotate each
    (even, odd) pair by its position's angle."""
    cos, sin = cos[None, :, None, :].to(x.dtype), sin[None, :, None, :].to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    bs, seq, n_kv, head_dim = x.shape
    if n_rep == 1:
        return x
    return x[:, :, :, None, :].expand(bs, seq, n_kv, n_rep, head_dim).reshape(bs, seq, n_kv * n_rep, head_dim)


class KVCache(nn.Module):
    """Keys and values of ``batch`` sequences, up to ``max_seq`` positions, for the KV heads this rank
    holds (``n_kv_heads``: the local count under tensor parallelism), [batch, heads, max_seq, head_dim]."""

    def __init__(self, batch: int, max_seq: int, n_kv_heads: int, head_dim: int, dtype=None, device=None):
        super().__init__()
        shape = (batch, n_kv_heads, max_seq, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def attend(self, xq: torch.Tensor, xk: torch.Tensor, xv: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """Write this step's keys and values (xk, xv [bs, seq, kv_heads, d]) at positions ``input_pos``
        [seq], then attend: query i sees the cached positions <= input_pos[i]. Grouped-query attention
        without repeating the cache: the n_rep query heads of each KV head (repeat_kv's order: query
        head h reads KV head h // n_rep) are folded into the query length. Returns [bs, seq, heads, d]."""
        self.k[:, :, input_pos] = xk.transpose(1, 2)
        self.v[:, :, input_pos] = xv.transpose(1, 2)
        bs, seq, heads, d = xq.shape
        n_kv = self.k.shape[1]
        n_rep = heads // n_kv
        q = xq.view(bs, seq, n_kv, n_rep, d).permute(0, 2, 3, 1, 4).reshape(bs, n_kv, n_rep * seq, d)
        visible = torch.arange(self.k.shape[2], device=input_pos.device)[None, :] <= input_pos[:, None]
        out = F.scaled_dot_product_attention(q, self.k, self.v, attn_mask=visible.repeat(n_rep, 1))
        return out.view(bs, n_kv, n_rep, seq, d).permute(0, 3, 1, 2, 4).reshape(bs, seq, heads, d)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads = args.n_heads, args.n_kv_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)
        self.cache: KVCache | None = None   # set for decoding (KVCache); None: causal over x alone

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                input_pos: torch.Tensor | None = None) -> torch.Tensor:
        """cos/sin: the whole rotary tables; input_pos [seq]: the tokens' positions, through the cache
        (None: positions 0..seq-1, causal attention over x, no cache)."""
        bs, seq, _ = x.shape
        # -1 heads: the local heads when the projections are column-sharded (as torchtitan does)
        xq = self.wq(x).view(bs, seq, -1, self.head_dim)
        xk = self.wk(x).view(bs, seq, -1, self.head_dim)
        xv = self.wv(x).view(bs, seq, -1, self.head_dim)
        cos, sin = (cos[:seq], sin[:seq]) if input_pos is None else (cos[input_pos], sin[input_pos])
        xq, xk = apply_rotary(xq, cos, sin), apply_rotary(xk, cos, sin)
        if input_pos is not None:
            out = self.cache.attend(xq, xk, xv, input_pos)
        else:
            n_rep = self.n_heads // self.n_kv_heads
            keys, values = repeat_kv(xk, n_rep), repeat_kv(xv, n_rep)
            out = F.scaled_dot_product_attention(xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                                 is_causal=True).transpose(1, 2)
        return self.wo(out.contiguous().view(bs, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.w1 = nn.Linear(args.dim, args.ffn_dim, bias=False)
        self.w2 = nn.Linear(args.ffn_dim, args.dim, bias=False)
        self.w3 = nn.Linear(args.dim, args.ffn_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs = ModelArgs()):
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args)
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        cos, sin = rotary_tables(args.dim // args.n_heads, args.max_seq_len, args.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor, input_pos: torch.Tensor | None = None) -> torch.Tensor:
        """x [bs, seq, dim]; input_pos [seq] (decoding through ``attention.cache``) or None."""
        # (input_pos by keyword: the sequence-parallel plan lays out the positional inputs only)
        h = x + self.attention(self.attention_norm(x), self.rope_cos, self.rope_sin, input_pos=input_pos)
        return h + self.feed_forward(self.ffn_norm(h))


def parallelize(block: TransformerBlock, mesh, sequence_parallel: bool) -> TransformerBlock:
    """torchtitan's tensor-parallel plan for one block (``sequence_parallel``: activations outside the
    attention and feed-forward sharded along the sequence, dim 1). The local heads of the sharded
    projections are inferred from the weights' shapes (the -1 in Attention.forward). Every rank built
    the same weights from one seed: each keeps its shards without communication (src_data_rank=None)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    plan = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel()}
    if sequence_parallel:
        plan.update({
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                            desired_input_layouts=(Replicate(), None, None)),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        })
    else:
        plan.update({"attention.wo": RowwiseParallel(), "feed_forward.w2": RowwiseParallel()})
    return parallelize_module(block, mesh, plan, src_data_rank=None)
