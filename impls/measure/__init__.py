"""Measurement, in one place: what this device and torch can do, and what the impls cost.

- :mod:`impls.measure.capabilities`: probes of the running torch and device (does ``addmm(out_dtype=)`` work,
  ``_scaled_mm``, PyTorch's ``linear_cross_entropy``), which the impls consult to pick their paths.
- :mod:`impls.measure.memory`: a dispatch-mode tracker of tensor-storage bytes (extra peak, bytes held from
  forward to backward), on any device including ``meta``; :mod:`properties.linear_ce.memory` applies it to a Problem.
- :mod:`impls.measure.timing`: CUDA timings (median of ``triton.testing.do_bench``), the matmul rate, and one
  forward+backward step's time and memory as ``numcheck bench`` reports them.
- :mod:`impls.measure.accumulation`: how far each grad_weight accumulation path drifts from float64.

The command-line front ends (tables, arguments, printing) are in :mod:`reports`.
"""
