"""The list of modules that define built-in impls. Importing this module registers them all.

Add a module here when it defines a ``@builtin_factory``; the registry imports nothing else.
"""

import impls.eager  # noqa: F401
import impls.liger  # noqa: F401
import impls.cce  # noqa: F401
import impls.chunked  # noqa: F401
import impls.recompute  # noqa: F401
import impls.torch_native  # noqa: F401
import impls.triton_ce  # noqa: F401
import impls.quant_linear  # noqa: F401
