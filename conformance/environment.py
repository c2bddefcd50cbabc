"""What a run ran on, for its report: versions, device, compute capability, commit (no host name)."""
from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

VENDOR_PACKAGES = ("torch", "triton", "flash-attn", "flash-attn-4", "flash-attn-cute", "flashinfer-python",
                   "nvidia-cutlass-dsl", "fbtriton", "tlx-jfa", "hypothesis", "pytest", "pytest-xdist",
                   "pytest-benchmark", "pytest-timeout")


def _git_commit() -> tuple[str | None, bool | None]:
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=10).stdout.strip()) if commit else None
        return commit, dirty
    except (OSError, subprocess.SubprocessError):
        return None, None


def environment(device: str) -> dict:
    """What the run ran on (no host name): versions, device, compute capability, commit."""
    import torch
    versions = {}
    for package in VENDOR_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    commit, dirty = _git_commit()
    env = {"python": platform.python_version(), "platform": f"{platform.system()} {platform.machine()}",
           "torch": torch.__version__, "triton": versions.get("triton"), "cuda": torch.version.cuda,
           "packages": versions, "device": device, "device_name": None, "compute_capability": None,
           "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
           "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available(),
           "git_commit": commit, "git_dirty": dirty}
    if device.startswith("cuda") and torch.cuda.is_available():
        env["device_name"] = torch.cuda.get_device_name(device)
        env["compute_capability"] = "{}.{}".format(*torch.cuda.get_device_capability(device))
    else:
        env["device_name"] = platform.processor() or platform.machine() or "cpu"
    return env
