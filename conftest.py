"""Loads the spec's pytest plugin for this checkout (installed users get it from `jfa-conformance run`)."""
import os

import torch

# Without a GPU, Triton kernels run under Triton's interpreter (set before triton is imported).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The project's own tests run `jfa-conformance run` many times: their compile caches and recorded check
# seconds go to a directory of their own, not the user's cache directory (conformance/cache.py).
if "JFA_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile
    os.environ["JFA_CACHE_DIR"] = tempfile.mkdtemp(prefix="jfa-conformance-tests-")
    atexit.register(shutil.rmtree, os.environ["JFA_CACHE_DIR"], ignore_errors=True)

pytest_plugins = ["conformance.plugin"]
