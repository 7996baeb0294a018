"""Tensor/sequence-parallel FP8 linear: cases, tolerance, properties and the suite's runner."""
