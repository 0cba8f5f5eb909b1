"""Under TRITON_INTERPRET=1 only: two costs of every interpreted op in triton 3.6 that depend on nothing but
their arguments, paid once instead of at every op (CI runs ~1,400 tests of interpreted kernels on 2 cores).

- ``interpreter._get_np_dtype`` builds a dict of 18 numpy dtypes at each call to look one up (~12k calls in
  five sentinel all-reduces at world size 2): now a lookup in a cache the original fills (pointers, and blocks
  of them, are uint64 as before).
- ``tl.tuple_type`` formats its ``name`` from every member type's string when it is made, and every
  ``tl.tensor`` and ``block_type`` makes one for its shape (~50k in the same calls), nearly none ever printed:
  now the same string is formatted when read.

Together ~15-20% of an interpreted launch (tests/test_gemm.py's matmul cases: 38-41 s -> 32-33 s). Its own
module, called by the package's __init__: a line added above blocks.py's kernels would change their
compile-cache keys (triton hashes a kernel's starting line), making every sm_90 compile check cold once.
"""

from __future__ import annotations

import numpy as np
import triton.language as tl


def cheaper_interpreted_types() -> None:
    from triton.runtime import interpreter

    numpy_dtype = interpreter._get_np_dtype
    known: dict = {}
    addresses = np.dtype(np.uint64)

    def cached_numpy_dtype(tt_dtype):
        scalar = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        if isinstance(scalar, tl.pointer_type):
            return addresses
        found = known.get(scalar)
        if found is None:
            found = known[scalar] = numpy_dtype(scalar)
        return found

    def tuple_type_init(self, types, fields=None):
        self.types = types
        self.fields = fields or [""] * len(types)

    def tuple_type_name(self) -> str:
        return "[" + ",".join(f"{k}:{v}" for k, v in zip(self.fields, self.types)) + "]"

    cached_numpy_dtype.original = numpy_dtype  # (the tests compare the two)
    interpreter._get_np_dtype = cached_numpy_dtype
    tl.tuple_type.__init__ = tuple_type_init
    tl.tuple_type.name = property(tuple_type_name)
