"""Drop-in entry points with the signatures of other fused linear + cross-entropy packages.

* ``lfce.compat.liger``: ``LigerFusedLinearCrossEntropyLoss`` and ``liger_fused_linear_cross_entropy``
  (Liger-Kernel 0.8's ``liger_kernel.transformers``);
* ``lfce.compat.cce``: ``linear_cross_entropy`` (Cut Cross-Entropy 25.1's ``cut_cross_entropy``);
* ``lfce.compat.torch``: ``linear_cross_entropy`` and ``LinearCrossEntropyLoss`` (PyTorch's
  ``torch.nn.functional`` / ``torch.nn`` fused loss, class-index targets).

Same argument names, order and defaults; the computation is lfce's. An option lfce does not
implement raises NotImplementedError naming it unless it has its default, so a call that relied
on it never gets another loss silently.
"""

from ..errors import UnsupportedError

__all__ = ["unsupported"]


def unsupported(package, name, value, default):
    """Raise NotImplementedError naming the option ``name`` of ``package`` unless it equals ``default``."""
    same = value is None if default is None else (value is not None and not hasattr(value, "shape")
                                                  and value == default)
    if not same:
        raise UnsupportedError(f"lfce does not implement {package}'s option {name}={value!r} yet (only "
                               f"{name}={default!r}); use {package} itself for it")
