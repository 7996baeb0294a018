"""The device the property suite draws its cases on, for every family: ``NUMCHECK_DEVICE`` (default ``cpu``;
``NUMCHECK_DEVICE=cuda`` runs the suite on the GPU)."""

from __future__ import annotations

import os

import torch

#: Device the property suite draws problems on (``NUMCHECK_DEVICE=cuda`` runs the suite on the GPU).
DEVICE = os.environ.get("NUMCHECK_DEVICE", "cpu")
#: Its type ("cpu", "cuda"), for comparing with declared devices.
DEVICE_TYPE = torch.device(DEVICE).type
