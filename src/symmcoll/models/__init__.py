"""Model code that runs on symmcoll: a client of the library, and the benchmark's workload.

``symmcoll.models.llama``: a Llama-style decoder block (RMSNorm, rotary GQA attention with a KV cache,
SwiGLU MLP), tensor-parallel over a process group, written once and run by one argument, ``mode``:

* ``"nccl"``: torch.distributed collectives (NCCL on GPU, gloo on CPU);
* ``"torch_async_tp"``: torch's ``symm_mem`` fused ops (CUDA only);
* ``"symmcoll"``: symmcoll's fused ops (``all_gather_matmul``, ``matmul_reduce_scatter``,
  ``matmul_all_reduce``, ``all_reduce_rms_norm``).

Decode is classic tensor parallelism (activations replicated, CUDA-graph capturable); prefill is
sequence-parallel (activations sharded by token). ``tp_comm`` says what each mode calls.

    from symmcoll.models import BlockConfig, BlockWeights, DecoderBlock, KVCache
    config = BlockConfig()                                   # 70B-class: hidden 8192, 64/8 heads, ffn 28672
    weights = BlockWeights.random(config, rank, world, seed=0, device="cuda")
    block = DecoderBlock(config, weights, "symmcoll")
    cache = KVCache.empty(config, world, batch=1, max_seq=4096, device="cuda")
    out_rows = block.prefill(x_rows, cache)                 # x_rows: this rank's B*S/W tokens
    out = block.decode(x, positions, cache)                 # x [B, hidden] on every rank, positions [B]

Benchmark (GPUs; all three modes in one run, one JSON per world size)::

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 symmcoll bench --op tp_block --world-size 2,4

CPU test (world size 2, tiny dims, interpreter): ``pytest tests/test_tp_block.py``.

``symmcoll.models.dtensor_llama`` is the other kind of model: torchtitan's Llama block, made tensor-parallel
by torch's ``parallelize_module`` plans, importing nothing of symmcoll. It is the client that
``symmcoll.backend`` serves unchanged (tests/test_compile_backend.py) and that ``symmcoll bench --op
backend_block`` times compiled with and without the backend.
"""

from .llama import LLAMA_70B, BlockConfig, BlockWeights, DecoderBlock, KVCache
from .tp_comm import MODES

__all__ = ["BlockConfig", "BlockWeights", "DecoderBlock", "KVCache", "LLAMA_70B", "MODES"]
