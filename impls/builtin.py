"""The list of modules that define built-in impls. Importing this module registers them all.

Add a module here when it defines a ``@builtin_factory``; the registry imports nothing else.
"""

import numcheck.impls.eager  # noqa: F401
import numcheck.impls.liger  # noqa: F401
import numcheck.impls.cce  # noqa: F401
import numcheck.impls.chunked  # noqa: F401
import numcheck.impls.recompute  # noqa: F401
import numcheck.impls.torch_native  # noqa: F401
import numcheck.impls.triton_ce  # noqa: F401
import numcheck.impls.quant_linear  # noqa: F401
