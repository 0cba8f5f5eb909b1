"""Collectives as Triton kernels over symmetric memory, one file per family."""
