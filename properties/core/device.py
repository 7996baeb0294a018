"""The device the property suite draws its cases on, for every family: ``NUMCHECK_DEVICE`` (default ``cpu``;
``NUMCHECK_DEVICE=cuda`` runs the suite on the GPU).

Where the judge runs is each family's oracle's choice, and one rule for all: the float64 oracle and the bounds
derived from it run on one device — the inputs' for linear+CE and linear-distill (blocked float64 matmuls sized for
production shapes), the CPU for the FP8 families and linear-preference (its oracle and bounds are built there) —
and every output judged against them, the impl's and judgement (b)'s yardstick's, is moved to the oracle's device
to be compared (:func:`~numcheck.properties.core.compare.compare`,
:func:`~numcheck.properties.core.relative.relative_judgement`, :func:`~numcheck.properties.core.relative.yardstick_error`).
"""

from __future__ import annotations

import os

import torch

#: Device the property suite draws problems on (``NUMCHECK_DEVICE=cuda`` runs the suite on the GPU).
DEVICE = os.environ.get("NUMCHECK_DEVICE", "cpu")
#: Its type ("cpu", "cuda"), for comparing with declared devices.
DEVICE_TYPE = torch.device(DEVICE).type


def undeclared_device(
    devices: frozenset[str] | tuple[str, ...], who: str = "the impl", device: str = DEVICE
) -> str | None:
    """Why an impl declaring ``devices`` cannot be judged on ``device`` (default: the suite's), with the fix, or
    ``None`` when it declares that device's type. ``who`` names the impl in the message.

    >>> undeclared_device(("cuda",), "mine", "cpu")
    "mine declares devices ['cuda'] and this run draws problems on 'cpu' (NUMCHECK_DEVICE); run it where it is declared, e.g. NUMCHECK_DEVICE=cuda"
    >>> undeclared_device(("cpu", "cuda"), device="cuda:0") is None
    True
    """
    if torch.device(device).type in devices:
        return None
    return (
        f"{who} declares devices {sorted(devices)} and this run draws problems on {device!r} "
        f"(NUMCHECK_DEVICE); run it where it is declared, e.g. NUMCHECK_DEVICE={sorted(devices)[0]}"
    )
