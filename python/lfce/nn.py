"""``LinearCrossEntropyLoss``: the fused loss as an ``nn.Module``."""

import torch

from .functional import linear_cross_entropy, validate_options

__all__ = ["LinearCrossEntropyLoss"]


class LinearCrossEntropyLoss(torch.nn.Module):
    """Module form of :func:`lfce.linear_cross_entropy`.

    The options are fixed at construction (and checked there); the weight is passed
    to ``forward`` so the module can share the model's output projection::

        loss_fn = lfce.LinearCrossEntropyLoss(ignore_index=-100)
        loss = loss_fn(hidden_states, model.lm_head.weight, labels)

    Args: see :func:`lfce.linear_cross_entropy` (ignore_index, reduction, mode,
    chunk_size, workspace_budget, softcap, temperature, z_loss_scale, return_z_loss).
    """

    def __init__(self, *, ignore_index=-100, reduction="mean", mode="recompute", chunk_size=None,
                 workspace_budget=None, softcap=None, temperature=None, z_loss_scale=None, return_z_loss=False):
        super().__init__()
        validate_options(ignore_index, reduction, mode, chunk_size, workspace_budget, softcap, temperature, z_loss_scale,
                         return_z_loss)
        self.softcap = softcap
        self.temperature = temperature
        self.z_loss_scale = z_loss_scale
        self.return_z_loss = return_z_loss
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.mode = mode
        self.chunk_size = chunk_size
        self.workspace_budget = workspace_budget

    def forward(self, hidden, weight, targets, bias=None):
        """Loss of ``hidden @ weight.T + bias`` against ``targets``; see linear_cross_entropy."""
        return linear_cross_entropy(
            hidden, weight, targets, bias, ignore_index=self.ignore_index, reduction=self.reduction,
            mode=self.mode, chunk_size=self.chunk_size, workspace_budget=self.workspace_budget,
            softcap=self.softcap, temperature=self.temperature, z_loss_scale=self.z_loss_scale,
            return_z_loss=self.return_z_loss,
        )

    def extra_repr(self):
        options = [f"ignore_index={self.ignore_index!r}", f"reduction={self.reduction!r}", f"mode={self.mode!r}"]
        if self.chunk_size is not None:
            options.append(f"chunk_size={self.chunk_size!r}")
        if self.workspace_budget is not None:
            options.append(f"workspace_budget={self.workspace_budget!r}")
        if self.softcap is not None:
            options.append(f"softcap={self.softcap!r}")
        if self.temperature is not None:
            options.append(f"temperature={self.temperature!r}")
        if self.z_loss_scale is not None:
            options.append(f"z_loss_scale={self.z_loss_scale!r}")
        if self.return_z_loss:
            options.append("return_z_loss=True")
        return ", ".join(options)
