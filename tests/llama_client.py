"""A client of symmcoll.backend that knows nothing of symmcoll: a Llama-3-style decoder block written the
way torchtitan writes it (module names, GQA by repeating KV heads, SwiGLU, ``nn.RMSNorm``, rotary
embeddings), parallelised with torch's own ``parallelize_module`` plans (torchtitan's: column-parallel
q/k/v and w1/w3, row-parallel wo and w2; with sequence parallelism, the norms run on sequence shards
and the attention / feed-forward inputs are gathered). Nothing here calls symmcoll: the tests compile
it with ``torch.compile(block, backend=symmcoll.backend(...))`` and compare with the same block run
uncompiled."""

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


def rotary_tables(head_dim: int, seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), freqs)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [bs, seq, heads, head_dim]: rotate each (even, odd) pair by its position's angle."""
    seq = x.shape[1]
    cos, sin = cos[None, :seq, None, :].to(x.dtype), sin[None, :seq, None, :].to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    bs, seq, n_kv, head_dim = x.shape
    if n_rep == 1:
        return x
    return x[:, :, :, None, :].expand(bs, seq, n_kv, n_rep, head_dim).reshape(bs, seq, n_kv * n_rep, head_dim)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads = args.n_heads, args.n_kv_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        bs, seq, _ = x.shape
        # -1 heads: the local heads when the projections are column-sharded (as torchtitan does)
        xq = self.wq(x).view(bs, seq, -1, self.head_dim)
        xk = self.wk(x).view(bs, seq, -1, self.head_dim)
        xv = self.wv(x).view(bs, seq, -1, self.head_dim)
        xq, xk = apply_rotary(xq, cos, sin), apply_rotary(xk, cos, sin)
        n_rep = self.n_heads // self.n_kv_heads
        keys, values = repeat_kv(xk, n_rep), repeat_kv(xv, n_rep)
        out = F.scaled_dot_product_attention(xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                             is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(bs, seq, -1))


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), self.rope_cos, self.rope_sin)
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
