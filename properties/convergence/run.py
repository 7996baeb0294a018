"""The tiny-model convergence run: linear+CE impls as the head of a small language model, judged against the
envelope eager's own deviation from float64 draws.

:func:`run` trains the model of :mod:`numcheck.properties.convergence.model` on the Markov data of
:mod:`numcheck.properties.convergence.data` (fixed by the seed) once per head: each impl under test (labels of
the caller's choosing, e.g. ``{"new": impl, "old": base}``), ``eager`` in the same dtype, and a float64 run.
Every run's loss curve and its per-step distance from the float64 run are kept; the judgement
(:mod:`numcheck.properties.convergence.envelope`) puts each impl inside or outside the envelope, with the ratio of
every step stated. :func:`assert_converges` is the same as an assertion for a user's own test.

>>> import numcheck
>>> from numcheck.impls.builtin.eager import eager_impls
>>> from numcheck.properties.convergence import run
>>> result = run.run({"mine": eager_impls()[0]}, dtype="float32", steps=4)
>>> result.ok, sorted(result.runs)
(True, ['eager', 'float64', 'mine'])
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import shlex
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from numcheck.errors import InvalidAssertion, PropertyFailure
from numcheck.impls.protocols.declaration import did_you_mean
from numcheck.impls.protocols.linear_ce import LINEAR_CE_KIND, validate_impl
from numcheck.properties.convergence import envelope as env_
from numcheck.properties.convergence.data import MarkovSource
from numcheck.properties.convergence.model import ModelShape, float64_head, impl_head, initial_parameters, train
from numcheck.properties.core.failures import exception_lines, impl_invocation
from numcheck.properties.linear_ce.cases import dtype_of
from numcheck.properties.linear_ce.harness import eager_yardstick

#: Training steps of the default run: the float64 loss falls from 4.8–5.3 to 2.1–2.8 on seeds 0–4 (the random
#: initial head starts above log V = 4.16; the source's entropy is 1.5–2.0 nats).
DEFAULT_STEPS = 30
#: Further data seeds eager is trained on to draw the envelope (:func:`envelope_seeds`).
DEFAULT_ENVELOPE_SEEDS = 4
#: Fraction of each batch's rows padded with ``ignore_index`` (as padded sequences are in LM training).
DEFAULT_IGNORED = 0.125
#: Labels the run gives its own two reference runs; an impl under test may not take them.
RESERVED_LABELS: tuple[str, ...] = ("eager", "float64")
#: The dtypes a convergence run may be asked for (an impl's head dtype).
DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
#: The keyword arguments of :func:`run` (and :func:`assert_converges`) besides the impls.
OPTIONS: tuple[str, ...] = ("dtype", "steps", "seed", "envelope_seeds", "ignored", "device", "shape")


@dataclass
class RunRecord:
    """One training run of a head.

    Attributes:
        label: the run's label (the caller's, or ``"eager"`` / ``"float64"``).
        impl: the head's impl name (``"float64"`` for the float64 composition).
        loss: every step's loss.
        distance: per metric of :data:`~numcheck.properties.convergence.envelope.METRICS`, the distance from the
            float64 run at every step.
        verdict: per metric, the envelope test (``None`` for the two reference runs).
        error: for an impl whose training raised, what it raised (:func:`~numcheck.properties.core.failures.
            exception_lines`); its loss and distances are then empty and it is outside.
    """

    label: str
    impl: str
    loss: list[float]
    distance: dict[str, list[float]]
    verdict: dict[str, env_.MetricVerdict] | None = None
    error: str | None = None

    @property
    def inside(self) -> bool | None:
        """Whether every metric is inside the envelope at every step (``None`` for a reference run; ``False``
        for a run that raised)."""
        if self.error is not None:
            return False
        return None if self.verdict is None else all(v.inside for v in self.verdict.values())

    def to_json(self) -> dict[str, Any]:
        """The JSON form."""
        out: dict[str, Any] = {"impl": self.impl, "loss": self.loss, "distance": self.distance}
        if self.error is not None:
            out.update(inside=False, error=self.error)
        if self.verdict is not None:
            out["inside"] = self.inside
            out["verdict"] = {m: v.to_json() for m, v in self.verdict.items()}
        return out


@dataclass
class ConvergenceResult:
    """Everything a convergence run measured: the runs (``float64``, ``eager``, then the impls in the caller's
    order), the rounding level ℓ(t) of each metric, the envelope and its derivation, the configuration."""

    config: dict[str, Any]
    runs: dict[str, RunRecord]
    level: dict[str, list[float]]
    envelope: dict[str, env_.MetricEnvelope]
    entropy: float
    seconds: float
    impls: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def judged(self) -> list[RunRecord]:
        """The runs of the impls under test, in the caller's order (one that raised included)."""
        return [r for r in self.runs.values() if r.verdict is not None or r.error is not None]

    @property
    def ok(self) -> bool:
        """Whether every impl under test is inside the envelope."""
        return all(r.inside for r in self.judged)

    def failure_lines(self, label: str) -> list[str]:
        """What put run ``label`` outside the envelope: what its training raised; or per metric outside, the worst
        step's distance, eager's, the bound k·d_eager + (k − 1)·ℓ and r against k, or that the envelope is
        undefined because eager diverged (empty when it is inside)."""
        rec, eager = self.runs[label], self.runs["eager"]
        if rec.error is not None:
            return [f"error: training with this head raised: {rec.error}"]
        lines = []
        for m, v in (rec.verdict or {}).items():
            if v.inside:
                continue
            if not math.isfinite(v.k):
                e = self.envelope[m]
                lines.append(
                    f"{m}: envelope undefined: eager's own distance from float64 is not finite at step "
                    f"{e.worst_step} on some of seeds {list(e.seeds)} (eager diverged), so no run can be "
                    f"judged inside"
                )
                continue
            t = v.worst_step
            bound = v.k * eager.distance[m][t] + (v.k - 1) * self.level[m][t]
            lines.append(
                f"{m}: outside at step {t} (first at step {next(i for i, r in enumerate(v.ratio) if not r <= v.k)}"
                f"): distance from float64 {rec.distance[m][t]:.3e} vs bound {bound:.3e} (k={v.k:.3g} × eager's "
                f"{eager.distance[m][t]:.3e} + (k−1) × rounding level {self.level[m][t]:.3e}); r={v.worst_ratio:.3g} > k"
            )
        return lines

    def to_json(self) -> dict[str, Any]:
        """The whole result as JSON-able data (``json.dumps`` writes non-finite numbers as ``Infinity``/``NaN``)."""
        return {
            "config": self.config,
            "ok": self.ok,
            "entropy": self.entropy,
            "seconds": self.seconds,
            "judgement": env_.__doc__.split("\n\n", 1)[1].strip(),
            "level": self.level,
            "envelope": {m: e.to_json() for m, e in self.envelope.items()},
            "runs": {k: r.to_json() for k, r in self.runs.items()},
        }


def _fail(call: str, msg: str, fix: str) -> InvalidAssertion:
    """The :class:`InvalidAssertion` of ``call``: what was wrong, then how to fix it."""
    return InvalidAssertion(f"{call}: {msg}\n  {fix}")


def _int(call: str, name: str, value: Any, least: int) -> int:
    """``value`` as an int ≥ ``least``; :class:`InvalidAssertion` naming ``name`` otherwise (a bool refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise _fail(call, f"{name} must be an int >= {least}, got {value!r}", f"e.g. {name}={max(least, 4)}.")
    return int(value)


def _dtype(call: str, value: Any) -> torch.dtype:
    """The torch dtype of ``value`` (a name of :data:`DTYPES` or a torch.dtype); :class:`InvalidAssertion` else."""
    name = str(value).removeprefix("torch.") if isinstance(value, (str, torch.dtype)) else None
    if name not in DTYPES:
        raise _fail(
            call,
            f"dtype must be one of {DTYPES} (a name or a torch.dtype), got {value!r}",
            f"e.g. dtype='bfloat16'.{did_you_mean(str(value), DTYPES)}",
        )
    return dtype_of(name)  # type: ignore[return-value]


def _settings(call: str, kw: Mapping[str, Any]) -> dict[str, Any]:
    """The checked settings of a run (defaults filled in); :class:`InvalidAssertion` on the first bad one."""
    for k in kw:
        if k not in OPTIONS:
            raise _fail(call, f"unknown keyword {k!r}", f"Keywords: {', '.join(OPTIONS)}.{did_you_mean(k, OPTIONS)}")
    s = {
        "dtype": _dtype(call, kw.get("dtype", "float32")),
        "steps": _int(call, "steps", kw.get("steps", DEFAULT_STEPS), 1),
        "seed": _int(call, "seed", kw.get("seed", 0), 0),
        "envelope_seeds": _int(call, "envelope_seeds", kw.get("envelope_seeds", DEFAULT_ENVELOPE_SEEDS), 1),
        "device": kw.get("device", "cpu"),
        "shape": kw.get("shape", ModelShape()),
    }
    ignored = kw.get("ignored", DEFAULT_IGNORED)
    if isinstance(ignored, bool) or not isinstance(ignored, numbers.Real) or not 0 <= ignored < 1:
        raise _fail(
            call, f"ignored must be a fraction in [0, 1), got {ignored!r}", "e.g. ignored=0.125, or 0 for no padding."
        )
    s["ignored"] = float(ignored)
    if not isinstance(s["device"], str) or torch.device(s["device"]).type not in ("cpu", "cuda"):
        raise _fail(call, f"device must be 'cpu' or 'cuda', got {s['device']!r}", "e.g. device='cuda'.")
    if not isinstance(s["shape"], ModelShape):
        raise _fail(
            call, f"shape must be a ModelShape, got {type(s['shape']).__name__}", "e.g. shape=ModelShape(rows=64)."
        )
    return s


def _check_impl(call: str, label: Any, impl: Any, s: dict[str, Any]) -> None:
    """:class:`InvalidAssertion` unless ``impl`` is an available linear+CE impl declaring the run's case."""
    if not isinstance(label, str) or not label or label in RESERVED_LABELS:
        raise _fail(
            call,
            f"label {label!r} is not allowed",
            f"Use a non-empty string other than {RESERVED_LABELS} "
            f"(the run adds those two itself), e.g. {{'new': impl}}.",
        )
    try:
        validate_impl(impl, f"{call} [{label!r}]")
    except TypeError as exc:
        raise _fail(call, str(exc), "Pass an impl object (e.g. one made with numcheck.linear_ce_impl).") from None
    if impl.kind != LINEAR_CE_KIND:
        raise _fail(
            call, f"impl {impl.name!r} is a {impl.kind} impl", "The convergence run needs a linear-ce impl as the head."
        )
    reason = impl.support.unavailable_reason()
    if reason:
        raise _fail(call, f"impl {impl.name!r} cannot run here: {reason}", "Skip where the requirement is unmet.")
    opts = ("ignore_index",) if s["ignored"] else ()
    why = impl.support.refuses(dtype=s["dtype"], device=torch.device(s["device"]).type, options=opts, reduction="mean")
    if why:
        raise _fail(
            call,
            f"impl {impl.name!r} does not declare the run's case: {why}",
            "Pick a declared dtype (dtype=...), or ignored=0 when it does not declare ignore_index.",
        )


def _record(label: str, impl: str, traj: Any, ref: Any) -> RunRecord:
    """The record of one trajectory: its losses and per-step distances from the float64 ``ref``."""
    return RunRecord(label=label, impl=impl, loss=traj.loss, distance=env_.distances(traj, ref))


def run(impls: Mapping[str, Any], **kw: Any) -> ConvergenceResult:
    """Train the tiny model once per head and judge each impl of ``impls`` (label → impl) against eager's envelope.

    Keywords (all optional): ``dtype`` (``"float32"``, ``"bfloat16"``, ``"float16"`` or a ``torch.dtype``; the head's
    compute dtype, master weights float32), ``steps`` (default :data:`DEFAULT_STEPS`), ``seed`` (the data and the
    initial parameters), ``envelope_seeds`` (further seeds eager is trained on to derive k), ``ignored`` (padded
    fraction of each batch, which needs ``ignore_index`` declared), ``device``, ``shape``
    (:class:`~numcheck.properties.convergence.model.ModelShape`). Every argument is checked before anything runs:
    :class:`~numcheck.properties.assertions.InvalidAssertion` says what was wrong and how to fix it.
    """
    call = "convergence.run"
    s = _settings(call, kw)
    if not isinstance(impls, Mapping) or not impls:
        raise _fail(
            call, f"impls must be a non-empty mapping of label -> impl, got {impls!r}", "e.g. run({'new': impl})."
        )
    for label, impl in impls.items():
        _check_impl(call, label, impl, s)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is fastest, and the same reduction order on every machine
    try:
        return _run(impls, s)
    finally:
        torch.set_num_threads(threads)


def _run(impls: Mapping[str, Any], s: dict[str, Any]) -> ConvergenceResult:
    """:func:`run` after its arguments were checked."""
    start = time.perf_counter()
    shape, dtype, device = s["shape"], s["dtype"], s["device"]
    eager = eager_yardstick()
    seeds = tuple(s["seed"] + i for i in range(s["envelope_seeds"] + 1))
    eager_units, records = [], {}
    for i, seed in enumerate(seeds):
        src = MarkovSource(vocab=shape.vocab, rows=shape.rows, steps=s["steps"], ignored=s["ignored"], seed=seed)
        init = initial_parameters(shape, seed)
        ref = train(src, shape, init, dtype=torch.float64, head=float64_head, device=device)
        level = env_.rounding_level(ref, dtype)
        e = train(src, shape, init, dtype=dtype, head=impl_head(eager), device=device)
        d_e = env_.distances(e, ref)
        eager_units.append({m: env_.units(d_e[m], level[m]) for m in env_.METRICS})
        if i == 0:
            judged = (src, init, ref, level)
            records = {
                "float64": _record("float64", "float64", ref, ref),
                "eager": _record("eager", eager.name, e, ref),
            }
    src, init, ref, level = judged
    valid = shape.rows - min(round(s["ignored"] * shape.rows), shape.rows - 1)  # rows carrying a gradient
    envelope = env_.envelope(eager_units, seeds, dtype=dtype, n_eff=min(valid, shape.vocab) * shape.hidden)
    for label, impl in impls.items():
        try:
            traj = train(src, shape, init, dtype=dtype, head=impl_head(impl), device=device)
        except Exception as exc:  # one broken head is a verdict on it, never the end of the others' runs
            records[label] = RunRecord(
                label=label,
                impl=impl.name,
                loss=[],
                distance={m: [] for m in env_.METRICS},
                error=" ".join(exception_lines(exc)),
            )
            continue
        rec = _record(label, impl.name, traj, ref)
        rec.verdict = env_.judge(rec.distance, records["eager"].distance, level, envelope)
        records[label] = rec
    config = {
        "dtype": str(dtype).removeprefix("torch."),
        "steps": s["steps"],
        "seed": s["seed"],
        "envelope_seeds": list(seeds[1:]),
        "ignored": s["ignored"],
        "device": device,
        "shape": dataclasses.asdict(shape),
        "master_dtype": "float64 (float64 run), float32 (the others)",
    }
    return ConvergenceResult(
        config=config,
        runs=records,
        level=level,
        envelope=envelope,
        entropy=src.entropy(),
        seconds=time.perf_counter() - start,
        impls=dict(impls),
    )


def shape_text(shape: Mapping[str, Any]) -> str:
    """A model shape as ``numcheck converge --shape`` takes it: ``vocab=64,hidden=32,...`` (every field)."""
    return ",".join(f"{k}={v!r}" for k, v in shape.items())


def parse_shape(text: str) -> ModelShape:
    """``KEY=VALUE,...`` over :class:`ModelShape`'s fields (any subset, the rest default); ValueError naming a
    key that is unknown or a value of the wrong type."""
    fields = {f.name: f.type for f in dataclasses.fields(ModelShape)}
    kw: dict[str, Any] = {}
    for item in (i.strip() for i in text.split(",") if i.strip()):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in fields:
            raise ValueError(
                f"--shape {text!r}: {item!r} is not KEY=VALUE with KEY one of {', '.join(fields)}"
                f"{did_you_mean(key, tuple(fields))}"
            )
        try:
            kw[key] = int(value) if fields[key] in (int, "int") else float(value)
        except ValueError:
            kind = "an int" if fields[key] in (int, "int") else "a number"
            raise ValueError(f"--shape {text!r}: {key}={value!r} is not {kind}") from None
    return ModelShape(**kw)


def repro_command(impl: Any, config: Mapping[str, Any]) -> str:
    """The ``numcheck converge`` line that reruns ``impl``'s convergence run with ``config``: every setting of
    :data:`OPTIONS` (``--envelope-seeds`` as the count of further seeds, the model shape in full)."""
    env, name = impl_invocation(impl)
    return (
        f"{env}numcheck converge --impl {shlex.quote(name)} --dtype {config['dtype']} --steps {config['steps']} "
        f"--seed {config['seed']} --envelope-seeds {len(config['envelope_seeds'])} --ignored {config['ignored']!r} "
        f"--device {shlex.quote(str(config['device']))} --shape {shape_text(config['shape'])}"
    )


def assert_converges(impl: Any, *, base: Any = None, **kw: Any) -> ConvergenceResult:
    """Assert that ``impl`` (and ``base``, when given: the impl it replaces) stays inside the envelope of the tiny
    convergence run; return the :class:`ConvergenceResult`.

    Keywords are those of :func:`run` (``dtype`` float32 unless given, e.g. ``dtype="bfloat16"``; ``steps=30``,
    ``seed=0``, ...). Raises
    :class:`~numcheck.properties.core.failures.PropertyFailure` (an ``AssertionError``) naming the impl, the run, the
    metric, the worst step, distance vs bound and the command that reruns it when it is outside;
    :class:`~numcheck.properties.assertions.InvalidAssertion` before running on a bad argument.

    >>> import numcheck
    >>> from numcheck.impls.builtin.eager import eager_impls
    >>> numcheck.assert_converges(eager_impls()[0], dtype="bfloat16", steps=4).ok
    True
    """
    impls = {"impl": impl} if base is None else {"impl": impl, "base": base}
    result = run(impls, **kw)
    bad = [r for r in result.judged if not r.inside]
    if bad:
        lines = []
        for r in bad:
            obj = result.impls[r.label]
            lines += [
                f"impl {obj.name!r} ({r.label}) is outside the envelope of eager's deviation from float64",
                f"  run: {', '.join(f'{k}={v}' for k, v in result.config.items() if k != 'shape')}",
                *(f"  {line}" for line in result.failure_lines(r.label)),
                f"  reproduce: {repro_command(obj, result.config)}",
            ]
        raise PropertyFailure("property 'convergence' fails\n" + "\n".join(lines))
    return result
