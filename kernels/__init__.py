"""Triton jagged flash attention (packed variable-length sequences)."""
from .jfa import (  # noqa: F401
    DQ_DETERMINISTIC,
    SUPPORTED_DTYPES,
    SUPPORTED_HEAD_DIMS,
    JaggedPlan,
    jagged_flash_attention,
)

__all__ = ["jagged_flash_attention", "JaggedPlan", "SUPPORTED_HEAD_DIMS", "SUPPORTED_DTYPES", "DQ_DETERMINISTIC"]
