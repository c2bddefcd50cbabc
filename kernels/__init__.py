"""Triton jagged flash attention (packed variable-length sequences)."""
from .jfa import (  # noqa: F401
    DQ_DETERMINISTIC,
    SUPPORTED_DTYPES,
    SUPPORTED_HEAD_DIMS,
    JaggedPlan,
    jagged_flash_attention,
)
from . import torch_ops  # noqa: F401,E402  (registers the custom operators torch.compile calls)

__all__ = ["jagged_flash_attention", "JaggedPlan", "SUPPORTED_HEAD_DIMS", "SUPPORTED_DTYPES", "DQ_DETERMINISTIC"]
