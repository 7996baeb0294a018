"""``torchao_float8[<recipe>]``: adapters for torchao's ``Float8Linear`` (``torchao.float8``), one per recipe of
``Float8LinearConfig.from_recipe_name`` in the installed release, each declared from that release's config.

Each call builds a real ``Float8Linear`` (``Float8Linear.from_float`` of an ``nn.Linear`` on the meta device, with
``from_recipe_name(recipe)`` and ``emulate=True`` on the CPU) and runs it with ``torch.func.functional_call`` on
the case's own ``weight`` and ``bias``, so autograd fills the caller's ``weight.grad`` and ``bias.grad``.

Semantics, read from torchao 0.18.0 (``float8/config.py``, ``float8_linear.py``, ``float8_utils.py``,
``float8_training_tensor.py``, ``float8_ops.py``):

- Scaling: ``amax_to_scale``: ``scale = fp32(fp8_max / max(amax, EPS))`` in float64, ``EPS = 1e-12``
  (``float8_utils.EPS``), and with ``round_scales_to_power_of_2`` ``2^floor(log2 scale)``. The cast is
  ``fp8(clamp(fp32(x) · scale, ±fp8_max))`` (``_ToFloat8ConstrFunc``, ``to_fp8_saturated``): numcheck's current
  scaling with ``amax_epsilon = EPS`` (:func:`reference.fp8_scaling.scale_from_amax`).
- Formats: ``CastConfig.target_dtype``, defaulting to E4M3 for input and weight, E5M2 for grad_output
  (``Float8LinearConfig.__post_init__``): ``"HYBRID"`` when grad_output is E5M2, ``"E4M3"`` when it is E4M3.
- Granularity per operand and GEMM: the six ``cast_config_*`` of the config (``config.py:335-378``,
  ``from_recipe_name``). Every one ``TENSORWISE`` and ``DYNAMIC`` is numcheck's ``current`` kind. ``rowwise``: all
  six ``AXISWISE``, E4M3 for every operand (grad_output too), ``round_scales_to_power_of_2=True``: numcheck's
  ``rowwise`` kind. ``rowwise_with_gw_hp``: x, W and grad_output ``AXISWISE`` (E4M3), W for grad_input
  ``TENSORWISE``, x and grad_output for grad_weight ``ScalingType.DISABLED`` (that GEMM in high precision),
  power-of-2 scales: numcheck's ``rowwise_gw_hp``. The axis of each axiswise cast is fixed in
  ``float8_linear.py`` (``matmul_with_hp_or_float8_args``): x ``axiswise_dim=-1`` (a scale per row of x over K,
  l. 62), Wᵀ ``0`` (per row of W over K, l. 79), grad_output ``-1`` for grad_input (per row of dy over N, l. 119),
  Wᵀ ``-1`` for grad_input (per column of W over N, l. 137), grad_output ``0`` and x ``0`` for grad_weight (per
  column over M, l. 174, 192): every operand scaled along its GEMM's reduction dimension, numcheck's
  rowwise/columnwise usages. The amax is ``torch.amax(abs(t), dim=axiswise_dim, keepdim=True)``
  (``float8_utils.py:69``) and the scale ``amax_to_scale`` (``float8_utils.py:45-53``) as for tensorwise; power-of-2
  rounding is ``exp2(floor(log2(scale)))`` of the fp32 scale (``float8_utils.py:244-246``). A high-precision GEMM
  is ``torch.mm`` of the saved x and the incoming grad_output in their dtype (``float8_linear.py:197``).
  Other combinations register as unavailable, naming their granularities.
- Saved for backward: ``matmul_with_hp_or_float8_args.forward`` saves ``input_hp`` (x itself) and the weight and
  quantizes both again in backward: ``save_original_input=True`` only.
- Output: the emulated GEMM is ``mm(data.float() / scale, ...)`` in fp32, cast to x's dtype; the bias is added
  after, in x's dtype (``Float8Linear.forward``): ``bias_after_output_rounding=True``
  (``docs/evidence/torchao_bias_rounding.py`` shows y equal to ``bf16(bf16(S) + b)`` bit for bit).

Device (:func:`placement`): on a CUDA device of compute capability 8.9 or more the impls run torchao's real path
(``emulate=False``: ``torch._scaled_mm``) and declare that device alone; elsewhere they run emulated and declare the
CPU. What the real path does is read from the loaded release, not written here (:func:`real_path`): its
``Float8Linear`` runs forward and backward once on the CPU with ``torch._scaled_mm`` replaced by a recorder, which
notes each GEMM's ``out_dtype`` and ``use_fast_accum``. An input dtype whose GEMMs the release asks for in another
output dtype (from 0.13.0 the rowwise recipes' fp32 input: ``out_dtype=bfloat16``, then cast back,
``addmm_float8_unwrapped``'s workaround of ``_scaled_mm`` lacking fp32 rowwise output) rounds y and the gradients
through that dtype, which the protocol's declaration cannot express: that dtype is not declared on CUDA, and the
description says why. The real GEMMs accumulate on Hopper's FP8 tensor cores (``accum_unit_roundoff`` 2⁻¹³); with
fast accumulation in any GEMM (the output GEMM's ``Float8GemmConfig(use_fast_accum=True)``) the whole reduction is
declared one chain (``accum_chunk=None``), otherwise promoted every :data:`HOPPER_PROMOTION` products.
``torch._scaled_mm`` needs each operand's trailing dimension a multiple of 16: the recorder notes which problem
dimensions reach one (its probe's M, K and N differ: every one for tensorwise and rowwise, whose backward GEMMs reduce
over N and M; K and N for rowwise_with_gw_hp, whose wgrad is a high-precision ``mm``), and those are declared
``dim_multiple`` 16 on CUDA, so the suite draws only such shapes there; the CPU's emulated path takes every shape.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import threading
import unittest.mock
from dataclasses import dataclass, field
from typing import Any

import torch

from numcheck.impls.protocols.fp8_linear import Fp8FunctionImpl, Fp8LinearSupport
from numcheck.reference.fp8_recipes import Fp8Recipe

#: The recipe names the adapter registers (``Float8LinearRecipeName`` values of 0.18.0); a release without one
#: registers it as unavailable with the reason.
RECIPE_NAMES: tuple[str, ...] = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
#: Input dtypes torchao's Float8Linear training path is tested in (its ``test/float8`` runs fp32 and bf16).
DTYPES: frozenset[torch.dtype] = frozenset({torch.float32, torch.bfloat16})
#: Unit roundoff of Hopper's FP8 tensor-core accumulation (about 14 bits kept), the real path's GEMMs.
HOPPER_ACCUM_UNIT_ROUNDOFF = 2.0**-13
#: Products a Hopper FP8 GEMM without fast accumulation sums before promoting to fp32.
HOPPER_PROMOTION = 128
#: Compute capability from which torch._scaled_mm runs FP8 GEMMs (Ada, Hopper and later).
REAL_PATH_CAPABILITY = (8, 9)


@dataclass(frozen=True)
class TorchaoInfo:
    """The installed torchao: its version, ``float8_utils.EPS``, the recipe names of ``Float8LinearRecipeName``,
    and the classes the adapter calls."""

    version: str
    eps: float
    recipe_names: tuple[str, ...]
    config_cls: Any = field(compare=False)
    linear_cls: Any = field(compare=False)


@functools.lru_cache(maxsize=None)
def load() -> TorchaoInfo | str:
    """Import ``torchao.float8``; the :class:`TorchaoInfo`, or the reason it cannot be used."""
    if importlib.util.find_spec("torchao") is None:
        return "torchao not installed"
    try:
        import torchao
        from torchao.float8 import Float8LinearConfig
        from torchao.float8.config import Float8LinearRecipeName
        from torchao.float8.float8_linear import Float8Linear
        from torchao.float8.float8_utils import EPS
    except Exception as exc:
        return f"torchao failed to import torchao.float8: {type(exc).__name__}: {exc}"
    version = str(getattr(torchao, "__version__", "unknown"))
    if not hasattr(Float8LinearConfig, "from_recipe_name"):
        return f"torchao {version} has no Float8LinearConfig.from_recipe_name (added in a later release)"
    return TorchaoInfo(
        version=version,
        eps=float(EPS),
        recipe_names=tuple(n.value for n in Float8LinearRecipeName),
        config_cls=Float8LinearConfig,
        linear_cls=Float8Linear,
    )


def release() -> str | None:
    """The imported torchao release's version, or ``None`` when torchao is unusable here."""
    info = load()
    return None if isinstance(info, str) else info.version


def recipe_config(info: TorchaoInfo, name: str, emulate: bool = True) -> Any:
    """``Float8LinearConfig.from_recipe_name(name)`` with ``emulate`` (True: the CPU path; False: ``_scaled_mm``)."""
    return dataclasses.replace(info.config_cls.from_recipe_name(name), emulate=emulate)


def placement() -> tuple[str, bool]:
    """Where the impls run here and whether emulated: ``("cuda", False)`` on a CUDA device of capability
    :data:`REAL_PATH_CAPABILITY` or more, ``("cuda", True)`` on an older one, else ``("cpu", True)``."""
    if not torch.cuda.is_available():
        return "cpu", True
    return "cuda", torch.cuda.get_device_capability() < REAL_PATH_CAPABILITY


@dataclass(frozen=True)
class RealPath:
    """What the release's real (``_scaled_mm``) path asks of its GEMMs for one recipe: per input dtype, the
    ``out_dtype`` of every ``_scaled_mm`` call of a forward and backward; whether any uses fast accumulation; and
    the problem dimensions (``"M"``, ``"K"``, ``"N"``) that reach a ``_scaled_mm`` operand's trailing dimension,
    which ``_scaled_mm`` needs a multiple of :data:`SCALED_MM_MULTIPLE`."""

    out_dtypes: tuple[tuple[torch.dtype, frozenset[torch.dtype]], ...]
    fast_accum: bool
    trailing_dims: frozenset[str] = frozenset()

    def rounded_through(self, dtype: torch.dtype) -> frozenset[torch.dtype]:
        """The output dtypes other than ``dtype`` its GEMMs produce for input ``dtype``."""
        return dict(self.out_dtypes)[dtype] - {dtype}


_PROBE_LOCK = threading.Lock()
#: ``torch._scaled_mm`` needs both operands' trailing dimensions multiples of 16 ("Expected trailing dimension of
#: mat1 to be divisible by 16", ``aten/src/ATen/native/cuda/Blas.cpp``; an H100 run refused every other shape).
SCALED_MM_MULTIPLE = 16
#: The probe problem of :func:`real_path`: x [M, K], W [N, K] with M, K, N distinct, so an operand's trailing size
#: names its problem dimension.
_PROBE_DIMS = {"M": 48, "K": 32, "N": 16}


@functools.lru_cache(maxsize=None)
def real_path(info: TorchaoInfo, name: str) -> RealPath:
    """Run the release's ``Float8Linear`` (recipe ``name``, ``emulate=False``) forward and backward on a small CPU
    problem per dtype of :data:`DTYPES` with ``torch._scaled_mm`` replaced by a recorder (which returns the
    dequantized product in the asked ``out_dtype``), and read what it asked for."""
    seen: list[tuple[torch.dtype, bool]] = []
    size_dim = {v: d for d, v in _PROBE_DIMS.items()}
    trailing: set[str] = set()

    def recorder(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False):
        seen.append((out_dtype, bool(use_fast_accum)))
        trailing.update(size_dim[s] for s in (a.shape[-1], b.shape[-1]))
        out = (a.float() * scale_a.float()) @ (b.float() * scale_b.float())
        return out.to(out_dtype or torch.float32) if bias is None else (out + bias.float()).to(out_dtype)

    out: list[tuple[torch.dtype, frozenset[torch.dtype]]] = []
    fast = False
    M, K, N = _PROBE_DIMS.values()
    with _PROBE_LOCK, unittest.mock.patch.object(torch, "_scaled_mm", recorder):
        for dtype in sorted(DTYPES, key=str):
            seen.clear()
            base = torch.nn.Linear(K, N, bias=False, dtype=dtype)
            module = info.linear_cls.from_float(base, config=recipe_config(info, name, emulate=False))
            x = torch.randn(M, K, dtype=dtype, requires_grad=True, generator=torch.Generator().manual_seed(0))
            module(x).sum().backward()
            out.append((dtype, frozenset(d for d, _ in seen)))
            fast = fast or any(f for _, f in seen)
    return RealPath(tuple(out), fast, frozenset(trailing))


_CAST_CONFIGS = (
    ("input", "cast_config_input"),
    ("weight", "cast_config_weight"),
    ("grad_output", "cast_config_grad_output"),
    ("input for grad_weight", "cast_config_input_for_grad_weight"),
    ("weight for grad_input", "cast_config_weight_for_grad_input"),
    ("grad_output for grad_weight", "cast_config_grad_output_for_grad_weight"),
)


#: Each numcheck recipe kind by the six cast configs' (scaling type, granularity), in :data:`_CAST_CONFIGS` order:
#: "T" tensorwise, "A" axiswise, "-" disabled (``ScalingType.DISABLED``: the GEMM in high precision). The axis of each
#: axiswise operand is fixed by ``float8_linear.py`` (``matmul_with_hp_or_float8_args``): the reduction dimension of
#: its GEMM, numcheck's rowwise / columnwise usage of :data:`numcheck.reference.fp8_recipes.GEMMS`.
_KIND_OF_GRANULARITIES: dict[str, str] = {
    "TTTTTT": "current",
    "AAAAAA": "rowwise",
    "AAA-T-": "rowwise_gw_hp",
}


def _granularities(config: Any) -> str:
    """The six cast configs of ``config`` as a :data:`_KIND_OF_GRANULARITIES` key."""
    from torchao.float8.config import ScalingGranularity, ScalingType

    out = ""
    for _, attr in _CAST_CONFIGS:
        cc = getattr(config, attr)
        disabled = cc.scaling_type is ScalingType.DISABLED
        out += "-" if disabled else ("T" if cc.scaling_granularity is ScalingGranularity.TENSORWISE else "A")
    return out


def numcheck_recipe(config: Any, eps: float) -> Fp8Recipe | str:
    """The numcheck recipe torchao's ``config`` runs, or why no numcheck recipe kind expresses it: every cast
    tensorwise is ``current``, every one axiswise ``rowwise``, and torchao's ``rowwise_with_gw_hp`` pattern (x, W,
    dy axiswise, W for grad_input tensorwise, the grad_weight GEMM disabled) ``rowwise_gw_hp``."""
    from torchao.float8.config import e4m3_dtype, e5m2_dtype

    sig = _granularities(config)
    kind = _KIND_OF_GRANULARITIES.get(sig)
    if kind is None:
        described = ", ".join(f"{label} {code}" for (label, _), code in zip(_CAST_CONFIGS, sig))
        return (
            f"no numcheck recipe kind has its scaling granularities ({described}; T tensorwise, A axiswise, "
            f"- high precision): the kinds are {', '.join(f'{k} {v}' for v, k in _KIND_OF_GRANULARITIES.items())}"
        )
    quantized = [(attr, getattr(config, attr).target_dtype) for (_, attr), c in zip(_CAST_CONFIGS, sig) if c != "-"]
    x_w = {d for attr, d in quantized if "grad_output" not in attr}
    dy = {d for attr, d in quantized if "grad_output" in attr}
    if x_w != {e4m3_dtype} or dy not in ({e4m3_dtype}, {e5m2_dtype}):
        fmts = [str(d).removeprefix("torch.") for _, d in quantized]
        return f"its FP8 dtypes {fmts} are not numcheck's E4M3 or HYBRID (E4M3 x and W, E5M2 or E4M3 grad_output)"
    fmt = "HYBRID" if dy == {e5m2_dtype} else "E4M3"
    return Fp8Recipe(kind, fp8_format=fmt, power_of_2_scales=bool(config.round_scales_to_power_of_2), amax_epsilon=eps)


def _module(info: TorchaoInfo, name: str, weight: torch.Tensor, bias: torch.Tensor | None, emulate: bool = True) -> Any:
    """A ``Float8Linear`` of ``weight``'s shape for recipe ``name``, its parameters on the meta device (the call
    substitutes the caller's tensors)."""
    out_features, in_features = weight.shape
    with torch.device("meta"):
        base = torch.nn.Linear(in_features, out_features, bias=bias is not None, dtype=weight.dtype)
    return info.linear_cls.from_float(base, config=recipe_config(info, name, emulate))


def torchao_fn(info: TorchaoInfo, name: str, declared: Fp8Recipe) -> Any:
    """The protocol call of ``torchao_float8[name]``: ``Float8Linear(x)`` with the caller's weight and bias."""
    label = f"torchao_float8[{name}]"

    def fn(x, weight, bias=None, *, recipe, save_original_input, scaling_state=None):
        """``y = Float8Linear(x)`` on the caller's ``weight`` and ``bias`` (torchao's recipe ``name``)."""
        if recipe != declared:
            raise ValueError(f"{label} runs torchao's recipe {name!r} = {declared.name}; cannot run {recipe.name}")
        if not save_original_input:
            raise ValueError(
                f"{label}: save_original_input=False is not available: torchao's Float8Linear always saves x "
                "itself and quantizes it again in backward"
            )
        params = {"weight": weight} if bias is None else {"weight": weight, "bias": bias}
        emulate = x.device.type != "cuda" or placement()[1]
        return torch.func.functional_call(_module(info, name, weight, bias, emulate), params, (x,))

    return fn


def _unavailable(name: str, reason: str) -> Fp8FunctionImpl:
    """``torchao_float8[name]`` registered as unavailable: its ``requires`` gives ``reason``, its call raises it."""
    label = f"torchao_float8[{name}]"

    def fn(x, weight, bias=None, *, recipe, save_original_input, scaling_state=None):
        """Raise: the impl cannot run here."""
        raise RuntimeError(f"{label} unavailable: {reason}")

    support = Fp8LinearSupport(  # not in force: requires says why the suite never calls it
        recipes=(Fp8Recipe("current"),),
        dtypes=DTYPES,
        devices=("cpu",),
        save_original_input=(True,),
        requires=functools.partial(_reason, reason),
    )
    return Fp8FunctionImpl(
        name=label, fn=fn, support=support, description=f"torchao Float8Linear recipe {name!r}: not judged (see 'here')"
    )


def _reason(reason: str) -> str:
    return reason


def torchao_impl(
    name: str, info: TorchaoInfo | str | None = None, where: tuple[str, bool] | None = None
) -> Fp8FunctionImpl:
    """``torchao_float8[name]``, declared from ``info`` (default: the installed release, :func:`load`) for the
    ``(device, emulated)`` ``where`` (default: :func:`placement`)."""
    info = load() if info is None else info
    if isinstance(info, str):
        return _unavailable(name, info)
    if name not in info.recipe_names:
        return _unavailable(name, f"torchao {info.version} has no recipe {name!r} (it has {list(info.recipe_names)})")
    recipe = numcheck_recipe(recipe_config(info, name), info.eps)
    if isinstance(recipe, str):
        return _unavailable(name, f"torchao {info.version} recipe {name!r}: {recipe}")
    device, emulate = placement() if where is None else where
    dtypes, accum, chunk, path, dims = DTYPES, 2.0**-24, None, "emulate=True", {}
    if not emulate:
        real = real_path(info, name)
        through = {d: real.rounded_through(d) for d in DTYPES}
        dtypes = frozenset(d for d in DTYPES if not through[d])
        accum, chunk = HOPPER_ACCUM_UNIT_ROUNDOFF, (None if real.fast_accum else HOPPER_PROMOTION)
        left = "; ".join(
            f"{_dt(d)} left out: its GEMMs output {', '.join(map(_dt, o))}" for d, o in through.items() if o
        )
        path = f"torch._scaled_mm on {device}" + (f" ({left})" if left else "")
        dims = {d: SCALED_MM_MULTIPLE for d in _PROBE_DIMS if d in real.trailing_dims}  # torch._scaled_mm's operands
    support = Fp8LinearSupport(
        recipes=(recipe,),
        dtypes=dtypes,
        devices=(device,),
        save_original_input=(True,),
        bias=True,
        bias_after_output_rounding=True,  # Float8Linear.forward: output + bias.to(output.dtype), after the GEMM's cast
        accum_unit_roundoff={device: accum},
        accum_chunk={device: chunk},
        dim_multiple=dims or 1,
    )
    shapes = f", {', '.join(dims)} multiples of {SCALED_MM_MULTIPLE}" if dims else ""
    desc = (
        f"torchao {info.version} Float8Linear, Float8LinearConfig.from_recipe_name({name!r}), {path}{shapes}: "
        f"{recipe.name}: scales fp8_max/max(amax, {info.eps:g}), x saved and quantized again in backward"
    )
    return Fp8FunctionImpl(
        name=f"torchao_float8[{name}]", fn=torchao_fn(info, name, recipe), support=support, description=desc
    )


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def torchao_impls() -> list[Fp8FunctionImpl]:
    """One impl per recipe of :data:`RECIPE_NAMES` (each unavailable, with the reason, where it cannot run)."""
    return [torchao_impl(name) for name in RECIPE_NAMES]
