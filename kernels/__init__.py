"""Jagged (packed, variable-length) flash attention in Triton (kernels/README.md: which file does what)."""
from .api import JaggedPlan, jagged_flash_attention
from .config import Config
from .plan import Paths
from .validation import SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS
from . import torch_ops  # noqa: F401,E402  (registers the custom operators torch.compile calls)

DQ_DETERMINISTIC = True  # every gradient has one writer per element: bitwise reproducible

__all__ = ["jagged_flash_attention", "JaggedPlan", "Config", "Paths", "SUPPORTED_HEAD_DIMS", "SUPPORTED_DTYPES",
           "DQ_DETERMINISTIC"]
