"""Errors in an impl's declaration, reported where the declaration is written.

A declaration (:func:`numcheck.impls.protocols.linear_ce.linear_ce_impl`, ``make_support``, ``LinearCESupport``, their
quantized-linear counterparts) is checked when it is made. What is wrong is raised as
:class:`InvalidDeclaration` whose message starts with the ``file:line`` of the user's call — the first frame
outside the declaring modules — then says what was wrong and how to fix it, as hypothesis' ``InvalidArgument``
does.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import pickle
import sys
from typing import Callable, Iterable

import torch

from numcheck.errors import InvalidDeclaration

#: Modules whose frames are the declaration machinery, never the place a declaration was written: this package's
#: modules, and ``dataclasses`` (a dataclass's generated ``__init__`` runs with its defining module's globals).
PROTOCOLS_PACKAGE = __name__.rpartition(".")[0]


def _declaring(module: object) -> bool:
    return module == "dataclasses" or (isinstance(module, str) and module.startswith(PROTOCOLS_PACKAGE + "."))


def declaration_site() -> str:
    """``file:line`` of the innermost frame outside the declaring modules (:data:`PROTOCOLS_PACKAGE`): the user's declaring call."""
    frame = inspect.currentframe()
    try:
        while frame is not None:
            if not _declaring(frame.f_globals.get("__name__")):
                return f"{frame.f_code.co_filename}:{frame.f_lineno}"
            frame = frame.f_back
        return "<unknown location>"
    finally:
        del frame


def defined_at(fn: object) -> str:
    """``file:line`` where ``fn`` (a function, or an object's ``__call__``) is defined, or ``"?"``."""
    target = inspect.unwrap(fn) if inspect.isroutine(fn) else type(fn).__call__  # type: ignore[arg-type]
    code = getattr(target, "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else "?"


def invalid(what: str, fix: str, *, site: str | None = None) -> InvalidDeclaration:
    """An :class:`InvalidDeclaration` reading ``"<site>: <what>\\n  <fix>"`` (``site`` defaults to
    :func:`declaration_site`)."""
    return InvalidDeclaration(f"{site or declaration_site()}: {what}\n  {fix}")


def chunk_size(owner: str, name: str, value: object) -> None:
    """Raise :class:`InvalidDeclaration` unless ``value`` (a chunked impl's ``name``: rows or classes per chunk) is
    an int >= 1 or ``None``."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise invalid(
            f"{owner}.{name} must be an int >= 1 or None, got {value!r}",
            "Give the rows (classes) per chunk, or None for one pass.",
        )


#: Shapes ``(N, H, V)`` a declared ``chunk_rule`` is called on when declared: one row, the suite's draws, and a
#: production shape (BT=8192, H=4096, Llama 3's V=128256).
CHUNK_RULE_PROBES: tuple[tuple[int, int, int], ...] = ((1, 1, 1), (257, 8, 24), (8192, 4096, 128256))


def chunk_rule(owner: str, rule: object, chunk_rows: int | None) -> None:
    """Raise :class:`InvalidDeclaration` unless ``rule`` is ``None`` or a function ``(N, H, V) -> int >= 1`` on
    every shape of :data:`CHUNK_RULE_PROBES`, declared without ``chunk_rows``."""
    if rule is None:
        return
    if not callable(rule):
        raise invalid(
            f"{owner}.chunk_rule={rule!r} is not callable",
            "Give a function (N, H, V) -> rows per chunk, e.g. chunk_rule=lambda N, H, V: 64.",
        )
    if chunk_rows is not None:
        raise invalid(
            f"{owner} declares both chunk_rows={chunk_rows!r} and chunk_rule",
            "Declare chunk_rows for a fixed chunk size, chunk_rule when it follows from the shapes.",
        )
    label = f"{owner}.chunk_rule {getattr(rule, '__name__', type(rule).__name__)} (defined at {defined_at(rule)})"
    for N, H, V in CHUNK_RULE_PROBES:
        try:
            rows = rule(N, H, V)
        except Exception as exc:  # noqa: BLE001 - the user's rule: any exception is a bad declaration
            raise invalid(
                f"{label} raised {type(exc).__name__}: {exc} on N={N}, H={H}, V={V}",
                "It is called with three positive ints and must return the rows per chunk.",
            ) from exc
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise invalid(
                f"{label} returned {rows!r} on N={N}, H={H}, V={V}",
                "It must return the rows per chunk as an int >= 1 (N or more: one chunk).",
            )


def did_you_mean(word: str, known: Iterable[str], aliases: dict[str, str] | None = None) -> str:
    """``" Did you mean 'x'?"`` for the closest of ``known`` (an ``aliases`` entry first), or ``""``."""
    known = list(known)
    guess = (aliases or {}).get(word.lower()) if isinstance(word, str) else None
    if guess is None and isinstance(word, str):
        guess = {k.lower(): k for k in known}.get(word.lower())
    if guess is None and isinstance(word, str):
        close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
        guess = close[0] if close else None
    return f" Did you mean {guess!r}?" if guess is not None else ""


def collection(owner: str, field: str, value: object, example: str) -> list:
    """``value`` as a list of entries; a bare string or a non-iterable is refused with a fix-it."""
    if isinstance(value, (str, bytes)):
        raise invalid(
            f"{owner}.{field}={value!r} is one string, not a collection of names",
            f"Write {field}=({value!r},) (a tuple), e.g. {field}={example}.",
        )
    try:
        return list(value)  # type: ignore[call-overload]
    except TypeError:
        raise invalid(f"{owner}.{field}={value!r} is not a collection", f"Write e.g. {field}={example}.") from None


#: Device types a declaration may name: those the suite draws problems on (``NUMCHECK_DEVICE``). A ROCm GPU is
#: ``"cuda"`` to torch.
DEVICE_TYPES: tuple[str, ...] = ("cpu", "cuda")
DEVICE_ALIASES: dict[str, str] = {
    "gpu": "cuda",
    "nvidia": "cuda",
    "rocm": "cuda",
    "hip": "cuda",
    "amd": "cuda",
    "cuda:0": "cuda",
    "host": "cpu",
}


def device_types(owner: str, value: object) -> frozenset[str]:
    """The declared ``devices``: a non-empty collection of :data:`DEVICE_TYPES`."""
    items = collection(owner, "devices", value, "('cpu', 'cuda')")
    if not items:
        raise invalid(
            f"{owner}.devices is empty: the suite could run the impl nowhere",
            f"Declare at least one device type of {DEVICE_TYPES}, e.g. devices=('cpu',).",
        )
    for d in items:
        if d not in DEVICE_TYPES:
            hint = did_you_mean(d, DEVICE_TYPES, DEVICE_ALIASES) if isinstance(d, str) else ""
            raise invalid(
                f"{owner}.devices={tuple(items)!r} names an unknown device type {d!r}",
                f"Device types are {DEVICE_TYPES} (torch.device(...).type; a ROCm GPU is 'cuda').{hint}",
            )
    return frozenset(items)


DTYPE_ALIASES: dict[str, str] = {
    "fp32": "float32",
    "f32": "float32",
    "single": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "f16": "float16",
}
#: torch's other names of the same dtypes (``torch.float``, ``torch.half``), accepted as they are.
TORCH_DTYPE_NAMES: dict[str, str] = {"float": "float32", "half": "float16"}


def dtypes(owner: str, field: str, value: object, allowed: tuple, *, empty_ok: bool) -> frozenset:
    """The declared dtypes of ``field``: ``torch.dtype`` objects or their names, each one of ``allowed``."""
    by_name = {str(d).removeprefix("torch."): d for d in allowed}
    shown = tuple(by_name)
    items = collection(owner, field, value, repr(shown[:1]))
    if not items and not empty_ok:
        raise invalid(
            f"{owner}.{field} is empty: the suite could draw no case for the impl",
            f"Declare at least one of {shown}, e.g. {field}=({shown[0]!r},).",
        )
    out = set()
    for d in items:
        name = TORCH_DTYPE_NAMES.get(d, d) if isinstance(d, str) else str(d).removeprefix("torch.")
        if name not in by_name or not (isinstance(d, str) or d in allowed):
            a_dtype = isinstance(d, torch.dtype) or isinstance(getattr(torch, str(d), None), torch.dtype)
            hint = "" if a_dtype else did_you_mean(str(d), shown, DTYPE_ALIASES)
            raise invalid(
                f"{owner}.{field}={tuple(items)!r} names {d!r}, which is not a dtype {field} may hold",
                f"Use torch dtypes or names of {shown}.{hint}",
            )
        out.add(by_name[name])
    return frozenset(out)


def known_names(
    owner: str,
    field: str,
    value: object,
    known: tuple[str, ...],
    *,
    empty_ok: bool,
    aliases: dict[str, str] | None = None,
    note: str = "",
) -> frozenset[str]:
    """The declared names of ``field``, each one of ``known``, with a did-you-mean for the first unknown one."""
    items = collection(owner, field, value, repr(known[:2]))
    if not items and not empty_ok:
        raise invalid(
            f"{owner}.{field} is empty: the suite could draw no case for the impl", f"Declare at least one of {known}."
        )
    for n in items:
        if n not in known:
            hint = did_you_mean(n, known, aliases) if isinstance(n, str) else ""
            raise invalid(
                f"{owner}.{field}={tuple(items)!r} has unknown entries {sorted(set(map(str, items)) - set(known))}",
                f"Allowed: {known}.{hint}{note}",
            )
    return frozenset(items)


def unknown_keywords(owner: str, given: Iterable[str], known: Iterable[str]) -> None:
    """Raise for the first of ``given`` not in ``known``, suggesting the closest known keyword."""
    known = sorted(known)
    for k in given:
        if k not in known:
            raise invalid(
                f"{owner} got an unknown keyword argument {k!r}",
                f"Keywords it takes: {', '.join(known)}.{did_you_mean(k, known)}",
            )


def bools(owner: str, obj: object, names: Iterable[str]) -> None:
    """Each of the declaration's fields ``names`` is ``True`` or ``False``."""
    for name in names:
        if not isinstance(getattr(obj, name), bool):
            raise invalid(f"{owner}.{name} must be True or False, got {getattr(obj, name)!r}", "Pass a bool.")


def requirement(owner: str, requires: object) -> None:
    """``requires`` is ``None`` or a zero-argument callable (the impl's check that it can run here)."""
    if requires is not None and not callable(requires):
        raise invalid(
            f"{owner}.requires must be a zero-argument callable or None, got {requires!r}",
            "Pass e.g. requires=lambda: None if torch.cuda.is_available() else 'needs CUDA'.",
        )


def requirement_unmet(requires: Callable[[], str | None] | None) -> str | None:
    """What a declaration's ``requires`` says keeps the impl from running here, or ``None``; a requirement check
    that raises is itself the reason."""
    if requires is None:
        return None
    try:
        return requires()
    except Exception as exc:  # noqa: BLE001 - a broken requirement check is itself a reason
        return f"requirement check raised {type(exc).__name__}: {exc}"


def elementary_mapping(owner: str, value: object, known: tuple[str, ...]) -> dict[str, object]:
    """``value`` (an ``elementary_error`` declaration) as a dict whose keys are all among ``known``."""
    example = '{"exp": 2, "exp_per_arg": 1.0, "log": 1, "tanh": 2}'
    if not isinstance(value, dict):
        raise invalid(
            f"{owner}={value!r} is not a mapping of ulps per function",
            f"Write e.g. elementary_error={example} (ulps from the correctly rounded result, as the CUDA "
            f"C++ Programming Guide states them), or numcheck.impls.protocols.linear_ce.ElementaryError(...).",
        )
    for k in value:
        if k not in known:
            hint = did_you_mean(k, known) if isinstance(k, str) else ""
            raise invalid(f"{owner} has an unknown key {k!r}", f"Keys it takes: {', '.join(known)}.{hint}")
    return dict(value)


def elementary_ulps(owner: str, fields: dict[str, object], known: tuple[str, ...]) -> dict[str, float]:
    """Each of ``known`` in ``fields`` as a finite float >= 0 (ulps), or raise naming the field."""
    out: dict[str, float] = {}
    for name in known:
        v = fields[name]
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 and v != float("inf")
        if not ok:
            raise invalid(
                f"{owner}.{name}={v!r} is not a number of ulps >= 0",
                "Give the function's maximum error in ulps from the correctly rounded result (0 for a "
                "correctly rounded one), e.g. 2 for CUDA's expf.",
            )
        out[name] = float(v)
    return out


# -- the machinery every protocol's decorator, built impl and conformance check shares ---------------------------
#: One call an impl must be able to take: (label in messages, the callable or None, why it cannot take the call).
Call = tuple[str, object, Callable[[object], "str | None"]]


def bad_name(name: object) -> bool:
    """Whether ``name`` is not a usable impl name (a non-empty, non-blank string)."""
    return not isinstance(name, str) or not name.strip()


def opening(
    decorator: str, name: object, declared: Iterable[str], fields: Iterable[str], example: str
) -> tuple[str, str]:
    """What every decorator checks before it sees the function: the name and the declaration's keywords.
    Returns ``(site, owner)``: the user's ``file:line`` and ``"<decorator>(name=...)"`` for later messages."""
    site = declaration_site()
    if bad_name(name):
        raise invalid(
            f"{decorator}(name={name!r}): the name must be a non-empty string",
            f"Give a short printable name, e.g. name={example!r}.",
            site=site,
        )
    owner = f"{decorator}(name={name!r})"
    unknown_keywords(owner, declared, fields)
    return site, owner


def decorated(owner: str, site: str, fn: object, hint: str, calls: Iterable[Call], takes: str, description: str) -> str:
    """What every decorator checks of the function it decorates: callable, and able to take each call in
    ``calls`` (``takes`` says which: "the calls the suite makes", ...). Returns the impl's description."""
    if not callable(fn):
        raise invalid(f"{owner} decorates {fn!r}, which is not callable", hint, site=site)
    refused(calls, f"{owner}: {{label}} (defined at {{at}}) cannot take {takes}", site=site)
    return description or (getattr(fn, "__doc__", None) or "").strip().split("\n")[0]


def refused(calls: Iterable[Call], what: str, *, site: str | None = None) -> None:
    """Raise :class:`InvalidDeclaration` for the first call of ``calls`` its callable cannot take; ``what`` is the
    message with ``{label}`` and ``{at}`` (where the callable is defined) to fill."""
    for label, fn, refusal in calls:
        why = refusal(fn) if fn is not None else None
        if why:
            raise invalid(what.format(label=label, at=defined_at(fn)), why, site=site)


def built(
    impl: object,
    support_type: type,
    fix: str,
    example: str,
    calls: Iterable[Call],
    takes: str,
    *,
    support: object = None,
) -> None:
    """What a built impl (``FunctionImpl`` and its counterparts) checks in ``__post_init__``: its name, its
    support's type (``fix`` says how to build one), each callable of ``calls`` callable and able to take its call."""
    name = getattr(impl, "name", None)
    if bad_name(name):
        raise invalid(
            f"an impl's name must be a non-empty string, got {name!r}",
            f"Give a short printable name, e.g. name={example!r}.",
        )
    support = getattr(impl, "support", None) if support is None else support
    if not isinstance(support, support_type):
        raise invalid(f"impl {name!r}: support must be a {support_type.__name__}, got {type(support).__name__}", fix)
    calls = list(calls)
    for i, (label, fn, _) in enumerate(calls):  # the first call is the impl's own function: never optional
        if (fn is not None or i == 0) and not callable(fn):
            raise invalid(f"impl {name!r}: {label}={fn!r} is not callable", "Pass a function.")
    refused(calls, f"impl {name!r}: its {{label}} (defined at {{at}}) cannot take {takes}")


def conformance(
    obj: object,
    origin: str,
    kind: str,
    checks: Iterable[tuple[bool, str]],
    calls: Iterable[Call],
    takes: str,
    *,
    pickled: bool = False,
    decorator: str = "",
) -> str:
    """The protocol check every kind shares, raising ``TypeError`` naming ``origin``: a name, then each of
    ``checks`` (``(holds, what is wrong)`` in order), each call of ``calls``, and (``pickled``) that the impl
    pickles, as the ranks receive it. Returns the impl's name."""
    name = getattr(obj, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{origin}: an impl needs a non-empty string attribute 'name' (got {name!r})")
    for holds, what in checks:
        if not holds:
            raise TypeError(f"{origin}: {kind} impl {name!r} {what}")
    for label, fn, refusal in calls:
        why = refusal(fn) if fn is not None else None
        if why:
            raise TypeError(
                f"{origin}: {kind} impl {name!r}{label} (defined at {defined_at(fn)}) cannot take {takes}: {why}"
            )
    if pickled:
        try:
            pickle.dumps(obj)
        except Exception as exc:  # noqa: BLE001 - any pickling error is the same defect
            raise TypeError(
                f"{origin}: {kind} impl {name!r} does not pickle ({type(exc).__name__}: {exc}); the ranks "
                f"receive it pickled: bind it at module level ({decorator} on a module-level "
                f"function) or make its class picklable"
            ) from None
    return name


def _by_reference(module: str, attr: str) -> object:
    """The object bound to ``module.attr`` (how a rank unpickles a module-level impl)."""
    obj: object = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def module_binding(obj: object, module_name: str | None) -> tuple[str, str] | None:
    """``(module, attr)`` of a module-level name bound to ``obj`` in ``module_name``, or ``None``."""
    module = sys.modules.get(module_name or "")
    if module is None or module_name == "__main__":
        return None
    return next(((module_name, a) for a, v in vars(module).items() if v is obj), None)


class PickledByReference:
    """Mixin of the impls the ranks receive pickled: bound at module level (what the decorators give), an impl
    pickles as that module-level name, else by its dataclass fields (``fn`` by reference)."""

    def __reduce__(self) -> object:
        bound = module_binding(self, getattr(getattr(self, "fn", None), "__module__", None))
        if bound is not None:
            return (_by_reference, bound)
        return (type(self), tuple(getattr(self, f.name) for f in dataclasses.fields(self)))  # type: ignore[arg-type]
