"""numcheck: correctness and numerics verification for linear + cross-entropy and FP8 quantized linear kernels.

``import numcheck`` is the public API; it changes nothing in the importing process (no environment variables,
no hypothesis profile loaded). Subpackages: :mod:`numcheck.reference` (float64 oracles), :mod:`numcheck.impls`
(the protocol and the implementations under test), :mod:`numcheck.properties` (strategies, tolerances,
properties), :mod:`numcheck.tests` (the suite, a pytest plugin) and :mod:`numcheck.reports` (the command line).

>>> import numcheck
>>> @numcheck.linear_ce_impl(name="doc_eager", dtypes=("float32",), options=(), autocast=())
... def impl(x, weight, target, bias=None, *, reduction="mean"):
...     import torch.nn.functional as F
...     return F.cross_entropy(F.linear(x, weight, bias), target, reduction=reduction)
>>> impl.name
'doc_eager'
"""

from numcheck.impls.protocol import FunctionImpl, LinearCESupport, linear_ce_impl, make_support
from numcheck.impls.quant_protocol import QuantLinearSupport
from numcheck.properties.suite_check import CheckResult, Verdict, check

__version__ = "0.1.0"

__all__ = ["CheckResult", "FunctionImpl", "LinearCESupport", "QuantLinearSupport", "Verdict", "check", "linear_ce_impl",
           "make_support"]
