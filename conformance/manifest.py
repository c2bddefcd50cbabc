"""The warm-up's record of earlier runs, ``warmup-manifest.json`` in the cache directory (cache.py).

It lists the (backend, configuration) jobs that finished ``ok`` under a *fingerprint* of everything that could
change the compiled kernels: the versions of Python, torch and Triton, the GPU and the sources of the
project's adapters and kernels, and, in each job's key, the versions of the packages that provide the
backend's own modules (``Backend.requires``), so that installing or upgrading one vendor's package recompiles
that vendor's kernels only. Jobs that ended in a compile error or a refusal are listed too, and not tried
again under the same fingerprint; crashes, timeouts and compilers the system killed (out of memory) are tried
again. Beside them, each job's last compile seconds whatever the fingerprint, which order the jobs of a run
that has to compile again (warmup.order). Delete the cache directory and everything is compiled again.
"""
from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .warmup import Job, Result

MANIFEST = "warmup-manifest.json"
FINGERPRINT_PACKAGES = ("torch", "triton")  # every backend's kernels depend on these


# Modules whose distribution the installed metadata may not name: the CuTe DSL's ``cutlass`` lives in a
# ``dsl_packages`` folder of nvidia-cutlass-dsl that its wheel puts on the path, not in a top-level entry.
_DISTRIBUTIONS = {"cutlass": ("nvidia-cutlass-dsl",)}


def package_versions(requires) -> str:
    """``dist=version`` of the installed distributions that provide the top-level modules of ``requires``
    (a backend's own packages: ``flash_attn.cute`` -> flash-attn-4, ...), those of FINGERPRINT_PACKAGES
    left out; "" for none."""
    import importlib.metadata
    providers = _module_distributions()
    dists = sorted({d for module in requires
                    for d in (*providers.get(module.split(".")[0], ()), *_DISTRIBUTIONS.get(module.split(".")[0], ()))}
                   - set(FINGERPRINT_PACKAGES))
    versions = []
    for dist in dists:
        try:
            versions.append(f"{dist}={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return ",".join(versions)


@functools.lru_cache(maxsize=1)
def _module_distributions() -> dict:
    import importlib.metadata
    return importlib.metadata.packages_distributions()


def fingerprint(device: str) -> str:
    """What the compiled kernels depend on besides the configuration (see the module docstring)."""
    import hashlib
    import importlib.metadata
    import platform

    digest = hashlib.sha256()
    digest.update(platform.python_version().encode())
    for package in FINGERPRINT_PACKAGES:
        try:
            digest.update(f"{package}={importlib.metadata.version(package)}".encode())
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        import torch
        if device.startswith("cuda") and torch.cuda.is_available():
            digest.update(torch.cuda.get_device_name(device).encode())
    except Exception:  # noqa: BLE001 - no device name: the versions still separate machines' kernels
        pass
    root = Path(__file__).resolve().parent.parent
    for folder in ("backends", "kernels"):
        for path in sorted((root / folder).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def job_key(job: Job) -> str:
    """The manifest's key of a job: the backend, its packages' versions, the configuration."""
    return f"{job.backend} | {job.packages} | {job.config.key}" if job.packages else seconds_key(job)


def seconds_key(job: Job) -> str:
    """The key of a job's last compile seconds, whatever the versions (they order an upgrade's jobs)."""
    return f"{job.backend} | {job.config.key}"


def read(cache_dir: Path) -> dict:
    """``{"compiled": {fingerprint: [job key, ...]}, "failed": {fingerprint: {job key: [outcome, message]}},
    "seconds": {job key: seconds}}`` (empty if unreadable)."""
    empty = {"compiled": {}, "failed": {}, "seconds": {}}
    try:
        data = json.loads((Path(cache_dir) / MANIFEST).read_text())
    except (OSError, ValueError):
        return empty
    if not isinstance(data, dict) or not isinstance(data.get("compiled"), dict):
        return empty
    failed = data.get("failed") if isinstance(data.get("failed"), dict) else {}
    return {"compiled": data["compiled"], "failed": failed, "seconds": dict(data.get("seconds") or {})}


def load(cache_dir: Path, print_: str) -> set[str]:
    """Jobs that finished ``ok`` in an earlier run with the same fingerprint."""
    return set(read(cache_dir)["compiled"].get(print_, []))


# Outcomes that the same versions and sources give again: a compile error, a configuration refused. A crash
# or a timeout may be the machine's (memory, another process), so those jobs run again.
REPEATABLE = ("error", "unsupported")
# A compile error whose compiler the system killed (ninja's ``FAILED: [code=137]``: signal 9, as the kernel's
# out-of-memory killer sends; or a shell's ``Killed``) is the machine's too: it is reported, not kept
_KILLED = re.compile(r"\[code=(?:129|13[0-9]|14[0-3])\]|\bKilled\b|\bSIGKILL\b")


def _repeatable(result: Result) -> bool:
    return result.outcome in REPEATABLE and not (result.outcome == "error" and _KILLED.search(result.message or ""))


def load_failed(cache_dir: Path, print_: str) -> dict[str, tuple[str, str]]:
    """Jobs that ended ``error`` or ``unsupported`` in an earlier run with the same fingerprint:
    job key -> (outcome, message)."""
    entries = read(cache_dir)["failed"].get(print_, {})
    if not isinstance(entries, dict):
        return {}
    return {key: (v[0], str(v[1] or "")) for key, v in entries.items()
            if isinstance(v, list) and len(v) == 2 and v[0] in REPEATABLE
            and not (v[0] == "error" and _KILLED.search(str(v[1] or "")))}  # (listed before that rule)


def load_seconds(cache_dir: Path) -> dict[str, float]:
    """Job key -> the compile seconds its last ``ok`` run took, under any fingerprint."""
    return read(cache_dir)["seconds"]


def save(cache_dir: Path, print_: str, jobs: list[Job], results: list[Result], done: set[str],
                  failed: dict[str, tuple[str, str]] | None = None) -> None:
    """Add the jobs that finished ``ok`` to the manifest and record their seconds; keep the jobs that ended
    in a :data:`REPEATABLE` failure (``failed``: what earlier runs recorded, plus this run's), so that the
    next run with the same fingerprint does not try them again (lists of other fingerprints are dropped)."""
    by_key = {(job.name, job.config.key): job_key(job) for job in jobs}
    ok = {by_key[r.backend, r.key]: r.seconds for r in results if r.outcome == "ok" and (r.backend, r.key) in by_key}
    timed = {seconds_key(job): ok[job_key(job)] for job in jobs if job_key(job) in ok}
    failures = dict(failed or {})
    for r in results:  # (this run's jobs: the recalled ones are not among them)
        key = by_key.get((r.backend, r.key))
        if key is not None and _repeatable(r):
            failures[key] = (r.outcome, r.message or "")
    for key in ok:
        failures.pop(key, None)
    seconds = {**load_seconds(cache_dir), **timed}
    path = Path(cache_dir) / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"compiled": {print_: sorted(set(done) | set(ok))},
                               "failed": {print_: {k: list(v) for k, v in sorted(failures.items())}},
                               "seconds": seconds}, indent=0))
    os.replace(tmp, path)


def split_done(jobs: list[Job], done: set[str], failed: dict[str, tuple[str, str]] | None = None
               ) -> tuple[list[Job], list[Result]]:
    """``(jobs still to run, results of those the manifest lists)``: compiled by an earlier run, or failed
    there in a way the same versions and sources repeat (``failed``, reported with that run's message)."""
    todo, known = [], []
    failed = failed or {}
    for job in jobs:
        key = job_key(job)
        if key in done:
            known.append(job.result("cached", message="compiled by an earlier run (manifest)"))
        elif key in failed:
            outcome, message = failed[key]
            known.append(job.result(outcome, message=f"{message} (an earlier run with the same versions and "
                                    "sources; not tried again)"))
        else:
            todo.append(job)
    return todo, known
