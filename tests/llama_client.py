"""The client of symmcoll.backend that knows nothing of symmcoll: the torchtitan-style Llama block of
``symmcoll.models.dtensor_llama`` (module names, GQA, SwiGLU, ``nn.RMSNorm``, rotary embeddings),
parallelised with torch's own ``parallelize_module`` plans (tensor parallel, and tensor + sequence
parallel). It lives in the package so that ``symmcoll bench --op backend_block`` times the same block
the tests check; that module imports nothing of symmcoll. The tests compile it with
``torch.compile(block, backend=symmcoll.backend(...))`` and compare with the same block run uncompiled."""

from symmcoll.models.dtensor_llama import (  # noqa: F401  (the tests use them as llama_client.*)
    LLAMA3_70B, Attention, FeedForward, KVCache, ModelArgs, TransformerBlock, apply_rotary, parallelize, repeat_kv,
    rotary_tables)
