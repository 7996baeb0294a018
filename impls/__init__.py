"""Implementations under test and the protocol they follow.

- :mod:`impls.protocol`: the linear+CE protocol (:class:`LinearCESupport`, :func:`linear_ce_impl`).
- :mod:`impls.registry`: built-ins, ``--impl`` specs, ``NUMCHECK_IMPLS`` and the ``numcheck.impls`` entry points.
- :mod:`impls.builtin`: the modules that hold the built-in impls.
"""

import os

import torch

# Triton kernels (Liger's, impls.triton_ce's) run on CPU only under TRITON_INTERPRET=1, and triton reads it
# when its own language module is imported, which torch does as a side effect of entering a dispatch mode or
# torch.compile. Decide it here, before anything in numcheck can cause that import.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from impls.protocol import FunctionImpl, LinearCESupport, linear_ce_impl, make_support  # noqa: E402

__all__ = ["FunctionImpl", "LinearCESupport", "linear_ce_impl", "make_support"]
