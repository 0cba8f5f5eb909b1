"""Communication fused with compute, one module per op, built on comm-style primitives, language/ and
the persistent GEMM in gemm.py."""
