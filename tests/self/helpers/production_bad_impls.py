"""Impls that end or stall their process, for the isolation test of ``numcheck production``
(tests/self/properties/test_production_tier.py): a crash stands in for a sticky CUDA fault, a sleep for a hung kernel."""

from __future__ import annotations

import os
import time

from numcheck.impls.builtin.eager import eager_impls
from numcheck.impls.protocols.linear_ce import FunctionImpl


def _crash(x, weight, target, bias=None, **options):
    os._exit(3)


def _hang(x, weight, target, bias=None, **options):
    time.sleep(600)
    return eager_impls()[0](x, weight, target, bias, **options)


crashes = FunctionImpl("crashes", _crash, eager_impls()[0].support)
hangs = FunctionImpl("hangs", _hang, eager_impls()[0].support)
