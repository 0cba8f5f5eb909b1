"""The HBM roofline of the memory-bound ops: bytes each kernel must read and write, the rate an SM copy
kernel reaches in the same run, and the codecs of the quantized all-reduce as kernels of their own.

Copy rate (``copy_gbps``): bench/bandwidth.py's SM copy kernel over 1 GiB (CUDA-graph replays; GB/s
count bytes read plus bytes written; torch's graph-captured ``copy_`` is reported beside it, not used).
A kernel at p% of it moves its bytes p% as fast as a plain copy could on this GPU.

Bytes each kernel must move (this rank's memory; what a perfect kernel would read and write once):

* all_reduce_rms_norm, tokens T, hidden H, ``s`` = T * H * itemsize: x and residual read, new residual
  and normed (1 byte per value for fp8) written, weight read, per-token scales written; with W > 1 also
  the words peers store into my slots, which I read and reset: one-shot 3 (W-1) s, two-shot 6 (W-1)/W s.
* moe_dispatch: my token rows read (each token once; W > 1: staged once more, written and read by the
  peers that need it: ``sent`` rows), every received row written, topk_ids read, row origins and my own
  tokens' rows written. moe_combine: every received expert output row read (W > 1: the remote ones
  stored into the peers' landing regions: ``sent``), every (token, slot) row that lands here written by
  a peer and read, every token row written, weights, ids and own rows read.
* the quantized all-reduce of s bytes (codes of r bytes per input byte: BITS / 8 / itemsize + 4 /
  (G * itemsize)): x read and the output written (2 s); W > 1 also both hops' codes landing in my slots,
  read and reset: 6 (W-1)/W s r.
* codecs: quantize reads s and writes s r; dequantize reads s r and writes s.

``quantize_kernel`` / ``dequantize_kernel`` run the codec helpers of language/codecs.py exactly as the
quantized all-reduce's stage 0 (quantize, pack, store codes and scales) and stage 2 (load, unpack,
decode, narrow) do, over a whole tensor: their rates are the codecs' rates.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..language import FORMAT_BITS, FORMATS, dequantize_groups, narrow, pack_words, quantize_groups, unpack_words
from ..fused import memory_bound_configs
from ..launcher import launch
from . import bandwidth

# Input elements per program step of the codec kernels (a multiple of every group size), warps, and
# the most programs (each loops over steps, as the quantized all-reduce's stages do): the untuned rule.
CODEC_BLOCK = 2048
CODEC_WARPS = 8
CODEC_PROGRAMS = 1024


@triton.jit(do_not_specialize=["numel"])
def quantize_kernel(x_ptr, words_ptr, scales_ptr, numel, FMT: tl.constexpr, BITS: tl.constexpr, G: tl.constexpr,
                    BLOCK: tl.constexpr):
    """x (numel values, a multiple of BLOCK) -> packed codes (numel * BITS / 32 int32 words) and one fp32
    scale per group of G: stage 0 of the quantized all-reduce over a whole tensor."""
    for block in range(tl.program_id(0).to(tl.int64), numel // BLOCK, tl.num_programs(0)):
        x = tl.load(x_ptr + block * BLOCK + tl.arange(0, BLOCK)[None, :]).to(tl.float32)
        codes, scales = quantize_groups(x, 1, BLOCK, G, FMT)
        tl.store(words_ptr + block * (BLOCK * BITS // 32) + tl.arange(0, BLOCK * BITS // 32)[None, :],
                 pack_words(codes, 1, BLOCK, BITS))
        tl.store(scales_ptr + block * (BLOCK // G) + tl.arange(0, BLOCK // G)[None, :], scales)


@triton.jit(do_not_specialize=["numel"])
def dequantize_kernel(words_ptr, scales_ptr, out_ptr, numel, FMT: tl.constexpr, BITS: tl.constexpr,
                      G: tl.constexpr, BLOCK: tl.constexpr):
    """Packed codes and scales -> values in out's dtype: stage 2 of the quantized all-reduce."""
    for block in range(tl.program_id(0).to(tl.int64), numel // BLOCK, tl.num_programs(0)):
        words = tl.load(words_ptr + block * (BLOCK * BITS // 32) + tl.arange(0, BLOCK * BITS // 32)[None, :])
        scales = tl.load(scales_ptr + block * (BLOCK // G) + tl.arange(0, BLOCK // G)[None, :])
        values = dequantize_groups(unpack_words(words, 1, BLOCK, BITS), scales, 1, BLOCK, G, FMT)
        tl.store(out_ptr + block * BLOCK + tl.arange(0, BLOCK)[None, :], narrow(values, out_ptr.dtype.element_ty))


def codec_buffers(numel: int, fmt: str, group_size: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(words, scales) for ``numel`` values (a multiple of CODEC_BLOCK)."""
    bits = FORMAT_BITS[FORMATS[fmt]]
    return (torch.empty(numel * bits // 32, dtype=torch.int32, device=device),
            torch.empty(numel // group_size, dtype=torch.float32, device=device))


def _codec_meta(fmt: str, group_size: int, block: int, warps: int) -> dict:
    code = FORMATS[fmt]
    # x * inverse + 0.5 must round twice, as the all-reduce and the reference do.
    return dict(FMT=code, BITS=FORMAT_BITS[code], G=group_size, BLOCK=block, num_warps=warps, enable_fp_fusion=False)


def _codec_grid(numel: int, block: int, group_size: int, programs: int, what: str) -> tuple[int]:
    if numel % block or block % group_size:
        raise ValueError(f"{what} must hold a multiple of {block} values (got {numel}) and the block whole groups")
    return (max(1, min(programs, numel // block)),)


def codec_config(fmt: str, direction: str, group_size: int, numel: int, device) -> tuple[int, int, int]:
    """(block, warps, programs) of the quantize ("q") or dequantize ("dq") kernel for ``numel`` values: the
    table measured on this GPU model (fused/memory_bound_configs.py) where its block fits the tensor,
    else CODEC_BLOCK, CODEC_WARPS, CODEC_PROGRAMS."""
    entry = memory_bound_configs.codec_entry(memory_bound_configs.device_table(torch.device(device)), fmt, direction,
                                             group_size, numel)
    if entry is not None and numel % entry["block"] == 0 and entry["block"] % group_size == 0:
        return entry["block"], entry["warps"], entry["programs"]
    return CODEC_BLOCK, CODEC_WARPS, CODEC_PROGRAMS


def quantize(x: torch.Tensor, words: torch.Tensor, scales: torch.Tensor, fmt: str, group_size: int,
             block: int | None = None, warps: int | None = None, programs: int | None = None) -> None:
    """Codes and scales of x; the launch is ``codec_config``'s unless all three are given."""
    if None in (block, warps, programs):
        block, warps, programs = codec_config(fmt, "q", group_size, x.numel(), x.device)
    launch(quantize_kernel, _codec_grid(x.numel(), block, group_size, programs, "x"), (x, words, scales, x.numel()),
           _codec_meta(fmt, group_size, block, warps))


def dequantize(words: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, fmt: str, group_size: int,
               block: int | None = None, warps: int | None = None, programs: int | None = None) -> None:
    """out from codes and scales; the launch is ``codec_config``'s unless all three are given."""
    if None in (block, warps, programs):
        block, warps, programs = codec_config(fmt, "dq", group_size, out.numel(), out.device)
    launch(dequantize_kernel, _codec_grid(out.numel(), block, group_size, programs, "out"),
           (words, scales, out, out.numel()), _codec_meta(fmt, group_size, block, warps))


# ---- bytes each kernel must move ------------------------------------------------------------------------

def code_ratio(fmt: str, group_size: int, itemsize: int) -> float:
    """Code bytes (codes and scales) per input byte."""
    return (FORMAT_BITS[FORMATS[fmt]] / 8 + 4 / group_size) / itemsize


def rms_norm_bytes(tokens: int, hidden: int, itemsize: int, quant: str | None, world: int = 1,
                   algorithm: str = "one_shot") -> int:
    s = tokens * hidden * itemsize
    local = 3 * s + tokens * hidden * (1 if quant else itemsize) + hidden * itemsize
    local += 4 * tokens if quant == "fp8_per_token" else 0
    if world > 1:
        local += 3 * (world - 1) * s if algorithm == "one_shot" else 6 * (world - 1) * s // world
    return local


def quantized_all_reduce_bytes(nbytes: int, itemsize: int, fmt: str, group_size: int, world: int) -> int:
    return int(2 * nbytes + (6 * (world - 1) / world * nbytes * code_ratio(fmt, group_size, itemsize)
                             if world > 1 else 0))


def codec_bytes(nbytes: int, itemsize: int, fmt: str, group_size: int) -> int:
    """Either direction: s one way, s * r the other."""
    return int(nbytes * (1 + code_ratio(fmt, group_size, itemsize)))


def moe_bytes(topk_ids: torch.Tensor, num_experts: int, world: int, rank: int, row_bytes: int,
              id_bytes: int, weight_bytes: int) -> tuple[int, int]:
    """(dispatch, combine) bytes of this rank's memory for routing ``topk_ids`` (this rank's; the ranks'
    routings are drawn alike, so this rank's counts stand for the rows it receives)."""
    tokens_n, k = topk_ids.shape
    local = num_experts // world
    valid = (topk_ids >= 0) & (topk_ids < num_experts)
    owner = torch.where(valid, topk_ids // local, -1)
    slots = int(valid.sum())                      # (token, slot) rows: received ones, summed over ranks
    remote_slots = int((valid & (owner != rank)).sum())
    per_dest = torch.stack([(owner == d).any(dim=1) for d in range(world)], dim=1)  # token -> rank needs it
    remote_rows = int(per_dest.sum()) - int(per_dest[:, rank].sum())
    ids = tokens_n * k * id_bytes
    dispatch = tokens_n * row_bytes + slots * row_bytes + ids + 2 * slots * 8 + tokens_n * k * 8
    if world > 1:
        dispatch += tokens_n * row_bytes + remote_rows * row_bytes  # staged, and read by the peers
    combine = slots * row_bytes + tokens_n * row_bytes + ids + tokens_n * k * (weight_bytes + 8)
    if world > 1:
        combine += 2 * remote_slots * row_bytes  # landed here by the peers, read by me
    return dispatch, combine


# ---- the copy rate ---------------------------------------------------------------------------------------

def copy_gbps(device) -> dict:
    """GB/s (read + write) of bench/bandwidth.py's SM copy kernel over 1 GiB (``best``: the rate the
    roofline uses), beside torch's ``copy_`` and the SM read rate (reported, not used)."""
    rates = bandwidth.measure(device)
    return {"sm copy": rates.copy_tbs * 1e3, "torch copy_": rates.torch_copy_tbs * 1e3,
            "sm read": rates.read_tbs * 1e3, "best": rates.copy_tbs * 1e3}


def compile_cases(make_workspace):
    """The codec kernels as ``symmcoll bench`` and benchmarks/roofline.py launch them: every
    format at group size 64 on bf16, int8 at the other group sizes, an fp32 case."""
    meta = torch.device("meta")
    cases = []
    for fmt, group_size, dtype in (("int8", 64, torch.bfloat16), ("fp8", 64, torch.bfloat16),
                                   ("int4", 64, torch.bfloat16), ("int8", 32, torch.bfloat16),
                                   ("int8", 128, torch.bfloat16), ("int4", 32, torch.float32)):
        def thunk(fmt=fmt, group_size=group_size, dtype=dtype):
            x = torch.empty(1 << 16, dtype=dtype, device=meta)
            words, scales = codec_buffers(x.numel(), fmt, group_size, meta)
            quantize(x, words, scales, fmt, group_size)
            dequantize(words, scales, torch.empty_like(x), fmt, group_size)
        cases.append((f"roofline.codec.{fmt}.G{group_size}.{dtype}", thunk))
    return cases
