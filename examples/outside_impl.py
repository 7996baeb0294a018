"""A linear+CE implementation that lives outside numcheck, plugged in through the public protocol.

Copy it anywhere (say /tmp/mymod.py), put that directory on PYTHONPATH, and no edit to the suite is needed:
    PYTHONPATH=/tmp pytest --impl mymod:impl               # the whole suite, this impl only
    PYTHONPATH=/tmp NUMCHECK_IMPLS=mymod:impl numcheck list  # listed beside the built-ins
"""

import torch.nn.functional as F

from numcheck.impls.protocols.linear_ce import linear_ce_impl


@linear_ce_impl(
    name="outside_fp32_logits",
    dtypes=("float32", "bfloat16", "float16"),
    autocast=(),
    options=("bias", "ignore_index", "label_smoothing", "class_weights"),
    all_ignored="nan",
    logits_dtype="float32",
    grad_accumulation="fp32",
)
def impl(x, weight, target, bias=None, *, reduction="mean", ignore_index=-100, label_smoothing=0.0, class_weights=None):
    """Upcast x, W and b to fp32, then F.linear and F.cross_entropy: logits are kept in fp32."""
    logits = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    cw = None if class_weights is None else class_weights.float()
    return F.cross_entropy(
        logits, target, weight=cw, reduction=reduction, ignore_index=ignore_index, label_smoothing=label_smoothing
    )
