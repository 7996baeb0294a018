"""One call of a third-party loss that wraps its per-chunk work in ``torch.compile`` (Liger-Kernel's chunked losses
with ``compiled=True``, its default) run compiled, or an error: the ``_compiled`` twins of
:mod:`~numcheck.impls.adapters.liger_preference` and :mod:`~numcheck.impls.adapters.liger_distill` are judged as
what their names claim, never as the eager path.

torch.compile does not always compile. Dynamo keeps at most ``recompile_limit`` variants of one code object
(``cache_size_limit`` up to torch 2.6; 8 by default) and compiles it at most ``accumulated_recompile_limit`` times
(256); past either it logs a warning and runs that function eagerly from then on, for the rest of the process. Liger's
paired preference losses (DPO, robust DPO, ORPO, CPO, SimPO) all compile one function (``fused_fwd_bwd`` of
``chunked_loss/fused_linear_preference.py``), KTO another, and each dtype, bias or none, loss, option and β (a
constant of Liger's closure) the suite draws is a variant: in one pytest worker the draws reached the limit, and the twins ran eager from there while judged
as compiled (an H100 run: ORPO's later cases, CPO and SimPO, ``results/gpu/h100-torch2.11-torchao-families``; on
the CPU with the ``eager`` backend, the preference suite's twins under the ci profile in one worker reach it on both
functions).

:func:`compiled_call` runs one call

- under dynamo's limits raised to :data:`RECOMPILE_LIMIT` and :data:`ACCUMULATED_LIMIT` (never lowered), with a
  limit reached raising instead of falling back (``fail_on_recompile_limit_hit``, ``fail_on_cache_limit_hit`` up to
  torch 2.6) and ``suppress_errors`` off (a compile error raises, as it does by default), each setting found by its
  name on the loaded torch (:func:`dynamo_settings`); restored after the call;
- with a witness inside the compiled region (:func:`watching`): the library's loss function that its compiled
  function calls on each chunk (``preference_loss_fn``, ``distillation_loss_fn``) is wrapped for the call by one
  that counts the chunks it runs outside dynamo (``torch.compiler.is_compiling()`` false). Where the compiled
  function runs compiled, dynamo traces the wrapper (the count is dead code there) or runs a cached graph, which
  holds none of it; so a chunk counted ran eagerly, whatever made it (a limit reached before the limits were raised,
  ``TORCH_COMPILE_DISABLE=1``, ``torch.compiler.set_stance("force_eager")``, a torch without the fail setting).
  The witness goes on outermost, over any wrapper of the adapter's own (the preference adapter's hand-off of the
  reference log-probabilities): put under that hand-off, Liger's compiled DPO returned wrong losses on the CPU.

A call that reached a limit or ran a chunk eagerly raises ``RuntimeError`` naming the impl, what dynamo reached or
did, and what to do. :data:`STATS` counts, per impl, the calls, the graphs dynamo compiled during them and the
calls refused (``tools/gpu/compiled_twins.py`` prints them).

>>> settings = dynamo_settings()  # names as the loaded torch spells them (torch 2.13's below)
>>> settings.get("suppress_errors"), settings.get("recompile_limit", RECOMPILE_LIMIT) >= RECOMPILE_LIMIT
(False, True)
"""

from __future__ import annotations

import collections
import contextlib
import re
from typing import Any, Callable, Iterator

import torch

#: The variants of one code object dynamo may keep while a twin runs. Each dtype, bias or none, loss, option and β
#: the suite draws is one for Liger's compiled chunk function (β is a constant of its closure): measured on the CPU
#: (``eager`` backend, ci profile, one worker, no limit), DPO's twin alone made 55 variants over the preference
#: suite's five tests (27 of them a new β), the six preference twins 123 over the two functions; the dev profile
#: draws ~3× more. A run that needs more raises (never runs eager).
RECOMPILE_LIMIT = 1024
#: The compiles of one code object dynamo may make while a twin runs, in all (a variant whose guards fail on a freed
#: object is compiled again): 4 × :data:`RECOMPILE_LIMIT`.
ACCUMULATED_LIMIT = 4 * RECOMPILE_LIMIT
#: Per impl name: ``calls``, ``graphs`` (compiled by dynamo during them), ``refused`` (calls that raised here).
STATS: collections.defaultdict[str, collections.Counter] = collections.defaultdict(collections.Counter)

#: Each setting by its names, newest first (torch 2.7 renamed the cache-size ones; the old names stay as aliases).
_NAMES = {
    "limit": ("recompile_limit", "cache_size_limit"),
    "accumulated": ("accumulated_recompile_limit", "accumulated_cache_size_limit"),
    "fail": ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"),
}


def _config() -> Any:
    import torch._dynamo

    return torch._dynamo.config


def _name(role: str) -> str | None:
    """The loaded torch's name of a setting (:data:`_NAMES`), or ``None`` where it has none."""
    return next((n for n in _NAMES[role] if hasattr(_config(), n)), None)


def dynamo_settings() -> dict[str, Any]:
    """The ``torch._dynamo.config`` values a twin's call runs under, by the loaded torch's names: the two limits
    raised to at least :data:`RECOMPILE_LIMIT` and :data:`ACCUMULATED_LIMIT`, the fail setting on, ``suppress_errors``
    off (torch refuses it beside the fail setting)."""
    cfg, out = _config(), {}
    for role, floor in (("limit", RECOMPILE_LIMIT), ("accumulated", ACCUMULATED_LIMIT)):
        if name := _name(role):
            out[name] = max(int(getattr(cfg, name)), floor)
    if name := _name("fail"):
        out[name] = True
    if hasattr(cfg, "suppress_errors"):
        out["suppress_errors"] = False
    return out


@contextlib.contextmanager
def watching(owner: type, attr: str) -> Iterator[list[int]]:
    """While open, ``owner.attr`` (a static method the compiled function calls on each chunk) is a wrapper that
    counts the calls it runs outside dynamo's tracing in the list it yields (one int); restored on exit."""
    original = owner.__dict__.get(attr)
    found = getattr(owner, attr) if original is None else original
    inner = found.__func__ if isinstance(found, staticmethod) else found
    eager = [0]

    def watched(*args: Any, **kwargs: Any) -> Any:
        if not torch.compiler.is_compiling():  # dead code where dynamo traces this: only an eager run counts
            eager[0] += 1
        return inner(*args, **kwargs)

    setattr(owner, attr, staticmethod(watched))
    try:
        yield eager
    finally:
        if original is None:  # inherited: the class's own attribute goes again
            delattr(owner, attr)
        else:
            setattr(owner, attr, original)


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _limit_reached(exc: BaseException) -> bool:
    """Whether ``exc`` is dynamo's refusal at a recompile limit (``FailOnRecompileLimitHit``; found by name, as its
    module moved between releases)."""
    return any(type(e).__name__ == "FailOnRecompileLimitHit" for e in (exc, exc.__cause__, exc.__context__) if e)


def reached_limit(exc: BaseException, settings: dict[str, Any]) -> str:
    """Which limit dynamo reached, with its value (``Limit type: <name>`` in the cause of torch 2.7 on, ``<name>
    reached`` in the message up to 2.6); both limits where neither says."""
    text = f"{exc} {exc.__cause__ or ''}"
    found = re.search(r"Limit type: (\w+)", text) or re.search(r"\b(\w+_limit) reached", text)
    names = [found.group(1)] if found else [n for n in settings if n in _NAMES["limit"] + _NAMES["accumulated"]]
    return " / ".join(f"torch._dynamo.config.{n}={settings.get(n, getattr(_config(), n, '?'))}" for n in names)


def limit_error(name: str, what: str, settings: dict[str, Any], exc: BaseException) -> RuntimeError:
    """The error of a call refused at a recompile limit (one line: a failure shows an impl's error's first line)."""
    return RuntimeError(
        f"{name}: torch.compile reached {reached_limit(exc, settings)} in this process on {what}, so this call would "
        f"have run eagerly while the impl is judged as compiled: run fewer of this impl's cases in one process (more "
        f"pytest-xdist workers, or -k on this impl alone) or raise "
        f"numcheck.impls.adapters.compiled_run.RECOMPILE_LIMIT (dynamo raised {type(exc).__name__}: "
        f"{' '.join(str(exc).split())[:120]})"
    )


def eager_error(name: str, what: str, chunks: int, frames: dict[str, int]) -> RuntimeError:
    """The error of a call that ran ``chunks`` chunk(s) eagerly."""
    cfg = _config()
    disabled = " (torch._dynamo.config.disable is set: TORCH_COMPILE_DISABLE=1?)" if getattr(cfg, "disable", 0) else ""
    return RuntimeError(
        f"{name}: {chunks} chunk(s) of this call ran eagerly, not compiled by torch.compile ({what}), while the impl "
        f"is judged as compiled{disabled}; dynamo's frames during the call: {frames or 'none converted'}. A function "
        f"that reached a recompile limit earlier in the process, TORCH_COMPILE_DISABLE=1, "
        f"torch.compiler.set_stance('force_eager') or a suppressed compile error each run it eagerly without an "
        f"error: rerun in a fresh process with TORCH_LOGS=recompiles,graph_breaks to see which."
    )


def compiled_call(name: str, what: str, owner: type, attr: str, call: Callable[[], Any]) -> Any:
    """``call()`` (one call of the impl ``name``, whose library compiles ``what``, calling ``owner.attr`` on each
    chunk inside the compiled region) run compiled under :func:`dynamo_settings`, or a ``RuntimeError`` saying why
    not (module docstring)."""
    from torch._dynamo.utils import counters

    settings = dynamo_settings()
    frames, graphs = dict(counters["frames"]), _graphs()
    STATS[name]["calls"] += 1
    try:
        with _config().patch(settings), watching(owner, attr) as eager:
            out = call()
    except Exception as exc:
        if _limit_reached(exc):
            STATS[name]["refused"] += 1
            raise limit_error(name, what, settings, exc) from exc
        raise
    finally:
        STATS[name]["graphs"] += _graphs() - graphs
    if eager[0]:
        STATS[name]["refused"] += 1
        delta = {k: v - frames.get(k, 0) for k, v in counters["frames"].items() if v != frames.get(k, 0)}
        raise eager_error(name, what, eager[0], delta)
    return out
