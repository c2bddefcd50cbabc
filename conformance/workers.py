"""How many worker processes a run uses, and where: the machine's cores, memory and GPUs decide."""
from __future__ import annotations

import os

GIB = 1 << 30
HOST_MEMORY_PER_WORKER = 3 * GIB  # a worker on a GPU machine: torch, CUDA, a backend's compiler, the oracle
GPU_MEMORY_PER_WORKER = 4 * GIB  # its CUDA context, caching allocator and the spec's small problems


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def host_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def default_workers(device: str, gpus: int = 1) -> int:
    """Workers that use the machine. On CPU one per core (at most 4: each holds a copy of the run's
    tensors). On a GPU, compiling and the float64 oracle are CPU work and one GPU serves many workers:
    one per core but one (the controller's), bounded by host and GPU memory."""
    count = cores()
    if not device.startswith("cuda"):
        return max(1, min(count, 4))
    bounds = [count - 1]
    host = host_memory()
    if host:
        bounds.append(host // HOST_MEMORY_PER_WORKER)
    try:
        import torch
        if torch.cuda.is_available():
            per_gpu = min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))
            bounds.append(gpus * (per_gpu // GPU_MEMORY_PER_WORKER))
    except Exception:  # noqa: BLE001 - no memory figure: the cores decide
        pass
    return max(1, gpus, min(bounds))


def worker_count(device: str, gpus: list[str] | None, requested: int | None) -> int:
    """``requested`` or the default, and with GPUs listed at least one per GPU."""
    n_gpus = len(gpus) if gpus else 1
    return max(n_gpus, requested or default_workers(device, n_gpus))


def worker_sets(device: str, gpus: list[str] | None, requested: int | None) -> list[tuple[str | None, int]]:
    """``[(gpu index or None, workers)]``: with GPUs listed the workers split evenly over them."""
    total = worker_count(device, gpus, requested)
    if not gpus:
        return [(None, total)]
    return [(g, total // len(gpus) + (1 if i < total % len(gpus) else 0)) for i, g in enumerate(gpus)]
