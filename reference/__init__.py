"""Float64 oracles: the ground truth numcheck measures every implementation against.

- :mod:`reference.options`: the linear+CE options (:class:`CEOptions`).
- :mod:`reference.linear_ce`: chunked float64 forward and analytic backward of linear + cross-entropy.
"""

from reference.linear_ce import LinearCEResult, linear_ce
from reference.options import CEOptions

__all__ = ["CEOptions", "LinearCEResult", "linear_ce"]
