"""One directory for every compile cache a run's processes share, and that consecutive runs reuse.

``jfa-conformance run --cache-dir DIR`` (else ``$JFA_CACHE_DIR``, else ``$XDG_CACHE_HOME/jfa-conformance``,
else ``~/.cache/jfa-conformance``) holds Triton's kernel cache, FA4's CuTe DSL cache, inductor's caches
(FX graphs, AOT autograd), FlashInfer's JIT workspace and the CUDA driver's PTX cache, each in its own
subfolder. A variable the user has set already (``TRITON_CACHE_DIR=...``) is kept.

Beside them, the run's own records of earlier runs: ``warmup-manifest.json`` (manifest.py: which kernel
configurations compiled, and in how many seconds) and ``check-seconds.json`` (check_order.py: how long each
check took, which orders the next run's checks longest first).
"""
from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "JFA_CACHE_DIR"
# variable -> subfolder of the cache directory
CACHE_VARIABLES = {
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": "fa4-cute-dsl",
    "CUDA_CACHE_PATH": "cuda",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
}
# switches that turn the caches on where they are off by default
CACHE_SWITCHES = {
    "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1",
    "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
    "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
}


CHECK_SECONDS = "check-seconds.json"


def check_seconds_file(directory: Path) -> Path:
    """The measured seconds per check of earlier runs (check_order.py)."""
    return Path(directory).expanduser() / CHECK_SECONDS


def default_dir(environ=None) -> Path:
    environ = os.environ if environ is None else environ
    if environ.get(ENV_VAR):
        return Path(environ[ENV_VAR]).expanduser()
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "jfa-conformance"


def cache_env(directory: Path, environ: dict) -> dict:
    """``environ`` plus the cache variables pointing into ``directory`` (created), user settings kept."""
    env = dict(environ)
    directory = Path(directory).expanduser().resolve()
    for variable, sub in CACHE_VARIABLES.items():
        if not env.get(variable):
            (directory / sub).mkdir(parents=True, exist_ok=True)
            env[variable] = str(directory / sub)
    for variable, value in CACHE_SWITCHES.items():
        env.setdefault(variable, value)
    return env


def size_of(directory: Path) -> int:
    """Bytes under ``directory`` (0 when it does not exist)."""
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total
