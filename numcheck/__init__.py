"""numcheck: correctness and numerics verification for linear + cross-entropy and FP8 quantized linear kernels.

``import numcheck`` is the public API; it changes nothing in the importing process (no environment variables,
no hypothesis profile loaded). Subpackages: :mod:`numcheck.reference` (float64 oracles), :mod:`numcheck.impls`
(the protocol and the implementations under test), :mod:`numcheck.properties` (strategies, tolerances,
properties), :mod:`numcheck.tests` (the suite, a pytest plugin) and :mod:`numcheck.reports` (the command line).

>>> import numcheck
>>> @numcheck.linear_ce_impl(name="doc_eager", dtypes=("float32",), options=(), autocast=())
... def impl(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100):
...     import torch.nn.functional as F
...     return F.cross_entropy(F.linear(x, weight, bias), target, reduction=reduction, ignore_index=ignore_index)
>>> impl.name
'doc_eager'
"""

from numcheck.impls.protocols.declaration import InvalidDeclaration
from numcheck.impls.protocols.dist_linear_ce import DistFunctionImpl, DistSupport, dist_linear_ce_impl
from numcheck.impls.protocols.grouped_fp8_linear import (GroupedFunctionImpl, GroupedQuantSupport,
                                                         grouped_quant_linear_impl)
from numcheck.impls.protocols.linear_ce import FunctionImpl, LinearCESupport, linear_ce_impl, make_support
from numcheck.impls.protocols.fp8_linear import (QuantFunctionImpl, QuantLinearSupport, make_quant_support,
                                           quant_linear_impl)
from numcheck.properties.assertions import InvalidAssertion, assert_linear_ce, assert_quant_linear
from numcheck.properties.convergence.run import ConvergenceResult, assert_converges
from numcheck.properties.core.failures import PropertyFailure
from numcheck.properties.fp8.cases import QuantCase
from numcheck.properties.fp8.grouped.cases import GroupedCase
from numcheck.properties.core.problems import Problem
from numcheck.properties.check import CheckResult, Verdict, check
from numcheck.impls.protocols.tp_fp8_linear import TPQuantFunctionImpl, TPQuantSupport, tp_quant_linear_impl
from numcheck.reference.fp8_recipes import Fp8Recipe

__version__ = "0.1.0"

__all__ = [
    "CheckResult", "ConvergenceResult", "DistFunctionImpl", "DistSupport", "Fp8Recipe", "FunctionImpl", "InvalidAssertion", "InvalidDeclaration", "LinearCESupport",
    "GroupedCase", "GroupedFunctionImpl", "GroupedQuantSupport", "grouped_quant_linear_impl",
    "Problem", "PropertyFailure", "QuantCase", "QuantFunctionImpl", "QuantLinearSupport", "TPQuantFunctionImpl",
    "TPQuantSupport", "Verdict", "assert_converges", "assert_linear_ce", "assert_quant_linear", "check",
    "dist_linear_ce_impl", "linear_ce_impl", "make_quant_support", "make_support", "quant_linear_impl",
    "tp_quant_linear_impl",
]
