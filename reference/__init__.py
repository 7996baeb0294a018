"""Float64 oracles: the ground truth numcheck measures every implementation against.

- :mod:`reference.options`: the linear+CE options (:class:`CEOptions`).
- :mod:`reference.linear_ce`: chunked float64 forward and analytic backward of linear + cross-entropy.
- :mod:`reference.fp8_formats`: bit-exact E4M3/E5M2/E8M0 and binary32 rounding (no torch float8 casts).
- :mod:`reference.fp8_recipes`: FP8 recipes (delayed, current, blockwise, MXFP8; E4M3 or HYBRID).
- :mod:`reference.fp8_scaling`: scales, blocks and quantization for every recipe.
- :mod:`reference.fp8_linear`: quantized linear forward/backward against dequantized and original operands.
- :mod:`reference.numerics`: the low-precision numerics the built-ins and the judge share (accumulation paths, chunk
  loop, CE block, and the yardsticks eager linear + CE and the single FP8 linear), so the judge never imports
  what it judges.
"""

from numcheck.reference.linear_ce import LinearCEResult, linear_ce
from numcheck.reference.options import CEOptions

__all__ = ["CEOptions", "LinearCEResult", "linear_ce"]
