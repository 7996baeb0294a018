"""The one runner of the suite's drawn properties, shared by the pytest suite (``numcheck.tests.suite``) and
:func:`numcheck.check`: an impl's example budget, when a property is skipped for an impl, and one example
(draw the problems, reject the known divergences, run the property, hand back its metrics).

A :class:`SuiteProperty` is one test of the suite: the property function it judges with, how it draws its
problems for an impl, and when it does not apply. Each family's suite is a table of them (linear+CE's
:data:`numcheck.properties.linear_ce.suite.SUITE`).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, ContextManager, Sequence

from hypothesis import assume, reject
from hypothesis.errors import HypothesisException, UnsatisfiedAssumption

from numcheck.errors import PropertyFailure, ProtocolViolation
from numcheck.properties.core import matmul_precision, poison
from numcheck.properties.core.failures import context as failure_context
from numcheck.properties.core.failures import failure_message, impl_raised, judged, raised_by_suite
from numcheck.properties.core.rows import Row, seeded_data

Metrics = dict[str, float]
#: ``draw(impl, data) -> case``: one case for ``impl`` (a linear+CE :class:`Problem`, a ``Fp8Case``, ...) from a
#: hypothesis ``st.data()`` object.
Draw = Callable[[Any, Any], Any]


def _never(impl: Any) -> str | None:
    """No reason to skip."""
    return None


def _no_fields(impl: Any) -> Any:
    """No field forced on every draw."""
    return None


@dataclass(frozen=True)
class SuiteProperty:
    """One drawn test of the suite, as both the plugin and :func:`numcheck.check` run it.

    ``name``: the verdict's name (the test's name without ``test_``, plus ``[id]`` for a parametrized one).
    ``check``: the property function (``check(impl, problem) -> metrics``, raising ``PropertyFailure``); its
    ``__name__`` is the property name known divergences and ``numcheck repro`` use. ``draw``: one problem.
    ``skip``: why the test says nothing about an impl (``None`` when it applies). ``every``: a problem carrying
    only the fields the test forces on every draw: a known divergence decided by those fields covers every draw,
    and the test is skipped with its reason. ``cases``: for a test that runs several variants of the impl in one
    example (each with its own draw), ``impl -> [(impl variant, draw)]``, in place of ``draw``; by default
    ``[(impl, draw)]``.

    ``dimensions``: the dimensions of its family's covering design the property varies through its draws (and does
    not pin itself; linear+CE's :data:`numcheck.properties.linear_ce.coverage.DIMENSIONS`): a pairwise covering design over
    them (:func:`rows`) runs before the random draws, so a small budget still meets every pair of their values.
    ``slow_dimensions``: the dimensions of its rows for impls that declare ``slow`` (each of their examples costs
    seconds under an interpreter): ``None`` (the default) runs no rows for them, only their random share.
    ``budget_scale``: how many times the profile's examples the property gets, for a property whose example
    costs far less than a linear+CE call (a quantizer on one tensor: hundreds of examples in seconds); 1 for
    the rest. See :func:`budget`.
    ``row_pins``: fields every covering row pins besides its dimensions' (e.g. the regime a property's defect class
    shows in), listed in the row's label. ``describe``: ``(impl, case) -> line`` saying what a case means for the
    impl (how many chunks its rows make), put into every failure message of that case (``None``: nothing).

    What a family adds to these steps (its covering design, how a row pins its draws, why an impl declares no case
    to draw, its known divergences) are the methods below, which add nothing here; a family's suite overrides them
    in a subclass (linear+CE's: :class:`numcheck.properties.linear_ce.suite.LinearCEProperty`)."""

    #: The module of the family's known divergences and of its covering design, as messages name them.
    known_module: ClassVar[str] = ""
    design_module: ClassVar[str] = ""

    name: str
    check: Callable[[Any, Any], Metrics]
    draw: Draw | None
    skip: Callable[[Any], str | None] = _never
    every: Callable[[Any], Any] = _no_fields
    cases: Callable[[Any], Sequence[tuple[Any, Draw]]] | None = field(default=None)
    dimensions: tuple[str, ...] = ()
    slow_dimensions: tuple[str, ...] | None = None
    budget_scale: int = 1
    row_pins: tuple[tuple[str, Any], ...] = ()
    describe: Callable[[Any, Any], str | None] | None = None

    def __post_init__(self) -> None:
        if (self.draw is None) == (self.cases is None):
            raise ValueError(f"suite property {self.name!r}: give exactly one of draw and cases")
        if isinstance(self.budget_scale, bool) or not isinstance(self.budget_scale, int) or self.budget_scale < 1:
            raise ValueError(
                f"suite property {self.name!r}: budget_scale must be an int >= 1, got {self.budget_scale!r}"
            )

    @property
    def property_name(self) -> str:
        """The property function's name (``accuracy``, ``frozen_x``, ...)."""
        return self.check.__name__

    def variants(self, impl: Any) -> Sequence[tuple[Any, Draw]]:
        """The ``(impl, draw)`` pairs one example runs."""
        if self.cases is not None:
            return self.cases(impl)
        assert self.draw is not None  # __post_init__
        return [(impl, self.draw)]

    # -- what a family adds (nothing here) ---------------------------------------------------------------------
    def design(self, impl: Any, dimensions: Sequence[str]) -> tuple[Row, ...]:
        """The covering rows over ``dimensions`` for ``impl`` on the suite's device (:func:`rows`): none."""
        return ()

    def pinned(self, row: Row) -> ContextManager[None]:
        """A block inside which the property's draws pin ``row``'s fields (:func:`run_rows`)."""
        return contextlib.nullcontext()

    def undrawable(self, impl: Any) -> str | None:
        """Why ``impl`` declares no case this property can draw on the suite's device (``None``: it does)."""
        return None

    def known_for_every(self, impl: Any, fields: Any) -> Any:
        """The known divergence that covers every draw carrying ``fields`` (:attr:`every`'s), or ``None``."""
        return None

    def known_case(self, impl: Any, case: Any) -> Any:
        """The known divergence that covers ``case`` of ``impl`` (left out of the draws), or ``None``."""
        return None


#: Random draws every (property, impl) keeps after its covering rows, however many rows it has.
MIN_RANDOM = 2


def budget(impl: Any, max_examples: int, prop: SuiteProperty | None = None) -> int:
    """The random (hypothesis) examples ``prop`` gets on ``impl`` out of a profile's ``max_examples``.

    The impl's share first: ``max_examples × prop.budget_scale``, a quarter of it (at least 2) for impls that
    declare ``slow`` (interpreters). Its covering rows (:func:`rows`, run first by :func:`run_rows`) are taken
    out of that share, and at least :data:`MIN_RANDOM` random draws are left: a (property, impl) runs
    ``max(share, rows + MIN_RANDOM)`` examples in all when it has rows, ``share`` otherwise."""
    share = max_examples * (prop.budget_scale if prop is not None else 1)
    if getattr(impl.support, "slow", False):
        share = max(2, share // 4)
    n_rows = len(rows(prop, impl)) if prop is not None else 0
    return max(share - n_rows, MIN_RANDOM) if n_rows else share


def rows(prop: SuiteProperty, impl: Any) -> tuple[Row, ...]:
    """``prop``'s covering rows for ``impl`` on the suite's device: a pairwise design over ``prop.dimensions``
    (``prop.slow_dimensions`` for a slow impl) as the impl declares them
    (:meth:`SuiteProperty.design`: linear+CE's :func:`numcheck.properties.linear_ce.coverage.covering_rows`); none
    where those name no dimension, or for an impl its family designs no rows for."""
    dims = prop.slow_dimensions if getattr(impl.support, "slow", False) else prop.dimensions
    design = prop.design(impl, dims) if dims else ()
    if not prop.row_pins:
        return design
    pins = dict(prop.row_pins)
    return tuple(
        Row((*row.values, *((k, str(v)) for k, v in prop.row_pins)), {**row.force, **pins}, row.require)
        for row in design
    )


#: Seeded draws tried per covering row before it counts as rejected (every draw covered by a known divergence,
#: or by the draw's own data-dependent filter).
ROW_ATTEMPTS = 8


@dataclass
class RowsRun:
    """What :func:`run_rows` ran: each example's problems with their metrics, and the rows none of whose
    :data:`ROW_ATTEMPTS` seeded draws got past the rejections (a known divergence that covers the row)."""

    results: list[tuple[Any, Metrics]] = field(default_factory=list)
    rejected: list[Row] = field(default_factory=list)


def run_rows(prop: SuiteProperty, impl: Any) -> RowsRun:
    """``prop``'s covering rows on ``impl``, in order, each one example through :func:`run_example` with its
    other fields drawn by ``prop``'s own draw from :func:`~numcheck.properties.core.rows.seeded_data` (keyed by
    property, impl, row and attempt: the same draws in every process). Call it only where :func:`skip_reason`
    gave none. Raises what the property raises, with a note naming the row."""
    run = RowsRun()
    design = rows(prop, impl)
    for i, row in enumerate(design):
        for attempt in range(ROW_ATTEMPTS):
            key = f"{prop.name}|{impl.name}|row {i}|attempt {attempt}"
            try:
                with prop.pinned(row), seeded_data(key) as data:
                    run.results.extend(run_example(prop, impl, data))
            except UnsatisfiedAssumption:
                continue
            except BaseException as exc:
                exc.add_note(
                    f"numcheck: covering row {i + 1} of {len(design)} of {prop.name} for {impl.name} "
                    f"({row.label()}; {prop.design_module})"
                )
                raise
            break
        else:
            run.rejected.append(row)
    return run


def skip_reason(prop: SuiteProperty, impl: Any) -> str | None:
    """Why ``prop`` is skipped for ``impl``: it does not apply, the impl declares no case this run can draw (its
    real reason, e.g. a device it does not declare), or a known divergence covers every draw."""
    why = prop.skip(impl)
    if why:
        return why
    if why := prop.undrawable(impl):
        return f"no case this test draws is declared by {impl.name}: {why}"
    every = prop.every(impl)
    if every is not None and (k := prop.known_for_every(impl, every)) is not None:
        return f"every case this test draws is a known divergence ({prop.known_module}): {k.reason}"
    return None


def unsatisfiable_reason(impl: Any) -> str:
    """What a hypothesis ``Unsatisfiable`` means once :func:`skip_reason` let the test run: every case drawn was
    rejected by a data-dependent filter (a known divergence decided by the data, or the test's own filter)."""
    return (
        f"every case drawn for {impl.name} was rejected by a data-dependent filter: a known divergence decided "
        f"by the data (its family's, e.g. numcheck.properties.linear_ce.known) or this test's own condition on the "
        f"drawn values"
    )


def run_example(prop: SuiteProperty, impl: Any, data: Any) -> list[tuple[Any, Metrics]]:
    """One example of ``prop`` on ``impl``: each variant's problem drawn from ``data``, rejected (hypothesis'
    ``assume``) when a known divergence covers it, then judged; the judged problems with their metrics. A variant
    the property could not judge (it returned :data:`~numcheck.properties.core.failures.NOT_JUDGED`) is left out,
    and an example none of whose variants was judged is rejected like a filtered draw: it is neither counted nor
    passed. Raises what the property raises when it is the suite's verdict (``PropertyFailure``, numcheck's own
    ``AssertionError``; a :class:`~numcheck.errors.ProtocolViolation` becomes a
    ``PropertyFailure`` with the case and the repro line); any other exception (the impl's own: a
    ``ZeroDivisionError`` in a kernel wrapper, a third-party ``assert``) becomes a ``PropertyFailure`` naming
    impl, property, case, the exception and its innermost frame, with the repro line, chained ``from`` the
    original (hypothesis still shrinks it, and keeps failures of different origins apart). Hypothesis' own
    exceptions (a rejected draw) pass through."""
    out: list[tuple[Any, Metrics]] = []
    for variant, draw in prop.variants(impl):
        p = draw(variant, data)
        assume(prop.known_case(variant, p) is None)  # covered by tests/adapters/test_known_divergences.py
        with failure_context(prop.describe(variant, p) if prop.describe is not None else None):
            metrics = _judged(prop, variant, p)
        if judged(metrics):
            out.append((p, metrics))
    if not out:
        reject()
    return out


def _judged(prop: SuiteProperty, impl: Any, p: Any) -> Metrics:
    """``prop.check(impl, p)`` through :func:`judge`."""
    __tracebackhide__ = True
    return judge(prop.check, impl, p, name=prop.property_name)


def judge(check: Callable[[Any, Any], Any], impl: Any, p: Any, *, name: str | None = None) -> Any:
    """``check(impl, p)`` (a property function) under numcheck's GEMM precision, with an impl's exception turned
    into the suite's failure (see :func:`run_example`); used for the drawn tests and the fixed cases alike.
    ``name``: the property as ``numcheck repro`` names it, where that is not ``check.__name__``. Every
    uninitialised allocation is filled while it runs where :mod:`~numcheck.properties.core.poison` says so for the
    impl's kind and the property."""
    __tracebackhide__ = True
    prop = name or check.__name__
    try:
        with matmul_precision.pinned(), poison.judging(impl, prop):
            return check(impl, p)
    except HypothesisException:
        raise
    except ProtocolViolation as exc:
        raise PropertyFailure(failure_message(impl, prop, p, [f"protocol violation: {exc}"]), case=p) from exc
    except Exception as exc:  # noqa: BLE001 - every exception is reported, the suite's verdicts as they are
        if raised_by_suite(exc):
            raise
        raise impl_raised(impl, prop, p, exc) from exc


def target_scores(results: Sequence[tuple[Any, Metrics]]) -> Metrics:
    """One score per metric label for ``hypothesis.target`` (which takes each label once per example): the
    largest over the example's variants."""
    scores: Metrics = {}
    for _, metrics in results:
        for label, value in metrics.items():
            scores[label] = max(float(value), scores.get(label, -math.inf))
    return scores
