"""The low-precision numerics both sides of a comparison run: numcheck's built-in implementations
(:mod:`numcheck.impls.builtin`) and its judge (:mod:`numcheck.properties`) import them from here, so the judge never
imports what it judges.

Beside the float64 oracles of :mod:`numcheck.reference`, these compute in the dtypes real kernels use (bf16/fp16
matmuls, fp32 accumulation, FP8 GEMMs): the cross-entropy block with its row weights and reduction coefficients
(:mod:`~numcheck.reference.numerics.ce_block`), the chunk loop (:mod:`~numcheck.reference.numerics.sweep`), the
grad_weight accumulation paths (:mod:`~numcheck.reference.numerics.accumulation`), and the yardsticks the judge runs:
eager linear + CE for judgement (b) (:mod:`~numcheck.reference.numerics.eager`) and the single FP8 linear for the
grouped family's ``per_expert_linear`` (:mod:`~numcheck.reference.numerics.fp8_linear`). Device capability probes are
not here: where a path depends on one, the probe is an argument (:mod:`numcheck.impls.measure.capabilities` answers
it on both sides).
"""
