"""Finding backends by name: the spec's references, entry points (group ``jfa_conformance.backends``: the
project's adapters in backends/ and any third party's), or a ``package.module:attr`` /
``path/to/file.py:attr`` reference to a Backend, a Backend class or a plain callable."""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import sys
from pathlib import Path

from conformance.backend import Backend, BackendInfo

from .callable import CallableBackend

ENTRY_POINT_GROUP = "jfa_conformance.backends"

# The spec's own backends. Every adapter, the project's included, registers through the entry-point group
# (pyproject.toml), as a third party's does; adapters import their vendor package lazily, so listing is free.
BUILTIN: dict[str, str] = {
    "reference": "conformance.reference:Reference",
    "reference-online": "conformance.reference_online:ReferenceOnline",
}


class UnloadableBackend(Backend):
    """Stands in for a backend whose module failed to import, carrying the reason."""

    def __init__(self, name: str, reason: str):
        self.name, self.reason = name, reason

    def unavailable_reason(self, device: str) -> str | None:
        return self.reason


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def registration_note() -> str | None:
    """Why only the references are known, when no installed package registers a backend: the usual cause is
    running from a source checkout that was never installed, so its entry points were never written."""
    if _entry_points():
        return None
    return (f"no installed package registers a backend (entry-point group '{ENTRY_POINT_GROUP}'), so only the "
            "spec's references are known: install the package that declares the adapters (in this project's "
            "checkout: pip install -e .), or name a backend as module:attr")


def known_names() -> list[str]:
    """Every backend name this installation knows: the references first, then the entry points."""
    return list(BUILTIN) + [name for name in _entry_points() if name not in BUILTIN]


def _import_attr(ref: str):
    module_ref, _, attr = ref.rpartition(":")
    if not module_ref or not attr:
        raise ValueError(f"backend reference {ref!r} must look like 'package.module:attr' or 'file.py:attr'")
    if module_ref.endswith(".py"):
        path = Path(module_ref).resolve()
        if not path.is_file():
            raise ValueError(f"backend file {module_ref!r} does not exist")
        module_name = f"jfa_backend_{path.stem}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # lets pickling and dataclasses find the module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_ref)
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj
    except AttributeError:
        raise ValueError(f"{module_ref!r} has no attribute {attr!r}") from None


def as_backend(obj, name: str) -> Backend:
    """A Backend instance, a Backend subclass (instantiated) or a plain callable (wrapped)."""
    if isinstance(obj, Backend):
        return obj
    if inspect.isclass(obj) and issubclass(obj, Backend):
        return obj()
    if callable(obj):
        return CallableBackend(obj, name)
    raise ValueError(f"{name!r} is neither a Backend nor a callable (got {type(obj).__name__})")


def resolve(spec: str) -> Backend:
    """The backend named by ``spec``: a built-in name, an entry-point name, or a ``module:attr`` reference."""
    if spec in BUILTIN:
        try:
            return as_backend(_import_attr(BUILTIN[spec]), spec)
        except ImportError as exc:
            return UnloadableBackend(spec, f"its adapter failed to import: {exc}")
    entry_points = _entry_points()
    if spec in entry_points:
        try:
            return as_backend(entry_points[spec].load(), spec)
        except ImportError as exc:
            return UnloadableBackend(spec, f"entry point {entry_points[spec].value} failed to import: {exc}")
    if ":" in spec:
        return as_backend(_import_attr(spec), spec)
    raise ValueError(
        f"unknown backend {spec!r}: not one of {', '.join(known_names())}, and not a 'module:attr' reference "
        "(adapters register through the package's entry points: install it, e.g. `pip install -e .`)"
    )


def describe(spec: str, device: str) -> BackendInfo:
    backend = resolve(spec)
    reason = backend.unavailable_reason(device)
    caps = backend.capabilities.as_dict() if not isinstance(backend, UnloadableBackend) else {}
    source = BUILTIN.get(spec) or (_entry_points()[spec].value if spec in _entry_points() else spec)
    return BackendInfo(name=backend.name, source=source, available=reason is None, reason=reason, capabilities=caps)


def available(device: str) -> list[Backend]:
    """Every known backend that can run on ``device`` here."""
    backends = [resolve(name) for name in known_names()]
    return [b for b in backends if b.unavailable_reason(device) is None]
