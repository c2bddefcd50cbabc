"""Loads the spec's pytest plugin for this checkout (installed users get it from `jfa-conformance run`)."""
import os

import torch

# Without a GPU, Triton kernels run under Triton's interpreter (set before triton is imported).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest_plugins = ["conformance.plugin"]
