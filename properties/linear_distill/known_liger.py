"""Known divergences of Liger-Kernel's distillation losses (``liger_jsd[...]``,
:mod:`numcheck.impls.adapters.liger_distill`), consulted by the family's suite
(:class:`numcheck.properties.linear_distill.suite.DistillProperty`); the machinery is
:mod:`numcheck.properties.core.known`.

- liger-kernel 0.5.x and 0.6.x, the chunked ``LigerFusedLinearJSDLoss``: rows whose label is ``ignore_index`` are
  not masked — their divergence is in the loss (the sum is still divided by the non-ignored count) and their
  student rows get gradients. Fixed in 0.7.0. Evidence: ``docs/evidence/liger_distill_releases.txt`` (0.5.8 and
  0.6.4 fail accuracy, chunk invariance and ignored-rows-change-nothing on every case with ignored rows, pass
  without; 0.7.0, 0.8.2 and 0.8.5 pass all)."""

from __future__ import annotations

from numcheck.properties.core.known import KnownDivergence, Releases
from numcheck.properties.linear_distill.cases import DistillCase


def liger_release() -> str | None:
    """The liger-kernel release the adapter imported (:func:`numcheck.impls.adapters.liger.release`)."""
    from numcheck.impls.adapters import liger

    return liger.release()


#: The library the family's Liger adapters call (:data:`numcheck.properties.libraries.ADAPTER_LIBRARIES`).
LIBRARIES = (("liger_jsd[[]*", "liger-kernel", liger_release),)

KNOWN: tuple[KnownDivergence, ...] = (
    KnownDivergence(
        impls="liger_jsd[[]chunked]",
        properties=("*",),
        devices=("cpu", "cuda"),
        applies=lambda case: isinstance(case, DistillCase) and case.ignored > 0,
        reason=(
            "liger-kernel 0.5.x-0.6.x's chunked JSD loss does not mask rows whose label is ignore_index: their "
            "divergence is summed into the loss (divided by the non-ignored count) and their inputs get gradients "
            "(docs/evidence/liger_distill_releases.txt; fixed in 0.7.0)"
        ),
        example=DistillCase(N=12, H=8, V=24, ignored=5, seed=5),
        releases=Releases("liger-kernel", ">=0.5,<0.7", liger_release),
        library="liger-kernel",
        summary="chunked JSD loss counts ignored rows (loss and gradients)",
    ),
)


def known(impl_name: str, prop: str, case: DistillCase) -> KnownDivergence | None:
    """The entry covering ``case`` of ``impl_name`` under ``prop`` on the installed release, or ``None``."""
    return next((k for k in KNOWN if k.matches(impl_name, prop, case)), None)
