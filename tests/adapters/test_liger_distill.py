"""The ``liger_jsd`` adapters (tests/../impls/adapters/liger_distill.py): the installed Liger-Kernel release's fused
linear JSD and chunked JSD loss against the float64 oracle on hand-picked cases (every β regime, T ≠ 1, ignored
rows, several chunks), their declaration read from the release, and that they register with the reason when
Liger-Kernel is absent. The drawn suite judges them too (tests/suite/test_linear_distill.py).

Cost: about 12 Liger calls, the fused ones under the Triton interpreter (0.1–0.5 s each): under 10 s in all.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import numcheck.impls.adapters.liger as liger
import numcheck.impls.adapters.liger_distill as liger_distill
from numcheck.properties.core.device import DEVICE
from numcheck.properties.linear_distill.cases import DistillCase
from numcheck.properties.linear_distill.props import accuracy
from numcheck.tests.adapters.uninstalled import impls_while_uninstalled

pytestmark = pytest.mark.torch_versions(
    reason="Liger imported under this torch and its Triton (on torch 2.6 it cannot: unavailable with the reason)"
)

STATE = liger_distill.load()
SKIP_REASON = STATE if isinstance(STATE, str) else None

#: N = 19 rows make several chunks of both adapters (fused: ⌈19 / ⌈48/16⌉⌉ → 8 rows; chunked: 19 // 8 = 2 chunks).
CASES: list[DistillCase] = [
    DistillCase(N=19, H=16, V=48, beta=0.5, seed=1),
    DistillCase(N=19, H=16, V=48, beta=0.0, temperature=2.0, ignored=5, seed=2),
    DistillCase(N=19, H=16, V=48, beta=1.0, temperature=0.7, ignored=3, ignore_index=-1, upstream=0.75, seed=3),
    DistillCase(N=19, H=16, V=48, dtype="bfloat16", beta=0.1, scale=6.0, teacher_scale=8.0, seed=4),
    DistillCase(N=19, H=16, V=48, dtype="float16", beta=0.9, temperature=2.0, ignored=4, seed=5),
]


@pytest.mark.skipif(SKIP_REASON is not None, reason=str(SKIP_REASON))
@pytest.mark.parametrize("name", [liger_distill.FUSED, liger_distill.CHUNKED])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.dtype}-beta{c.beta}-seed{c.seed}")
def test_matches_oracle(name: str, case: DistillCase) -> None:
    impl = {i.name: i for i in liger_distill.liger_distill_impls()}[name]
    accuracy(impl, dataclasses.replace(case, device=DEVICE))


@pytest.mark.skipif(SKIP_REASON is not None, reason=str(SKIP_REASON))
def test_declaration_follows_installed_release() -> None:
    """Both declare Liger's conventions (forward KL at β = 0, T on both heads, no T², non-ignored tokens), the
    release's chunking and grad_weight path, and name the release in their description."""
    fused, chunked, compiled = liger_distill.liger_distill_impls()
    for impl in (fused, chunked, compiled):
        s = impl.support
        assert (s.beta_zero, s.temperature_on, s.temperature_squared, s.denominator) == (
            "forward_kl",
            "both",
            False,
            "tokens",
        )
        assert s.grad_accumulation == "param_dtype" and liger.release() in impl.description
    assert fused.support.rows_per_chunk(19, 16, 48) == 8 and chunked.support.rows_per_chunk(19, 16, 48) == 10
    assert (fused.support.divergence_dtype, chunked.support.divergence_dtype) == ("float32", "compute")
    assert "compiled=False" in chunked.description and "compiled=True" in compiled.description


def test_absent_liger_registers_with_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without liger-kernel both still register, and requires() says "liger-kernel not installed"."""
    impls = impls_while_uninstalled(
        monkeypatch, "liger_kernel", liger_distill.liger_distill_impls, (liger.load, liger_distill.load)
    )
    assert [i.name for i in impls] == [liger_distill.FUSED, liger_distill.CHUNKED, liger_distill.CHUNKED_COMPILED]
    for impl in impls:
        assert impl.support.unavailable_reason() == "liger-kernel not installed"
        with pytest.raises(RuntimeError, match="not installed"):
            impl(
                *(torch.zeros(1, 1),) * 4,
                torch.zeros(1, dtype=torch.long),
                beta=0.5,
                temperature=1.0,
                ignore_index=-100,
            )


def test_known_divergence_example_passes_outside_its_releases() -> None:
    """Each recorded divergence's example passes on the installed release where it is outside the entry's range
    (0.8.5 in CI: the ignored rows were fixed in 0.7.0), so the entry cannot outlive a fix unnoticed; inside the
    range the example fails (docs/evidence/liger_distill_releases.txt shows 0.5.8 and 0.6.4)."""
    from numcheck.properties.linear_distill.known_liger import KNOWN
    from numcheck.properties.linear_distill.props import PROPERTIES

    impls = {i.name: i for i in liger_distill.liger_distill_impls()}
    for entry in KNOWN:
        impl = impls[entry.impls.replace("[[]", "[")]
        if impl.support.unavailable_reason() or entry.releases.hold():
            continue
        PROPERTIES["ignored_rows_change_nothing"](impl, entry.example)
        accuracy(impl, entry.example)


@pytest.mark.skipif(SKIP_REASON is not None, reason=str(SKIP_REASON))
def test_compiled_chunked_variant_runs_liger_default_on_cuda_only():
    """``liger_jsd[chunked_compiled]`` hands ``compiled=True`` (Liger's default) to the chunked Function, the plain
    one ``False``; the compiled one declares CUDA only and, without it, says why it cannot run."""
    impls = {i.name: i for i in liger_distill.liger_distill_impls()}
    compiled = impls[liger_distill.CHUNKED_COMPILED]
    assert compiled.support.devices == {"cuda"}
    if not torch.cuda.is_available():
        assert "judged on CUDA" in compiled.support.unavailable_reason()
    chunked_fn = STATE[1]
    for flag in (False, True):
        seen = {}

        class Recording:
            forward = chunked_fn.forward
            distillation_loss_fn = chunked_fn.__dict__["distillation_loss_fn"]

            @staticmethod
            def apply(*args):
                params, _ = liger_distill.forward_parameters(Recording)
                seen.update(zip(params, args))
                return torch.zeros(())

        call = liger_distill._chunked_call(Recording, compiled=flag)
        x, w = torch.randn(4, 8), torch.randn(16, 8)
        call(x, w, x, w, torch.zeros(4, dtype=torch.long), beta=0.5, temperature=1.0, ignore_index=-100)
        assert seen["compiled"] is flag
