"""Backends by name, by entry point, and by module/file reference."""
from __future__ import annotations

import importlib.metadata
import textwrap

import pytest

from conformance import registry
from conformance.callable import CallableBackend
from conformance.reference import Reference
from conformance.backend import Backend


def test_builtin_names_resolve_to_their_adapters():
    assert isinstance(registry.resolve("reference"), Reference)
    assert registry.resolve("sdpa").name == "sdpa"
    assert registry.known_names()[:2] == ["reference", "reference-online"]
    assert registry.describe("sdpa", "cpu").source == "backends.sdpa:Sdpa"  # the project's adapters: entry points


def test_every_known_backend_gives_an_availability_answer_on_cpu():
    for name in registry.known_names():
        info = registry.describe(name, "cpu")
        assert info.available or info.reason, name


def test_module_attr_accepts_instances_classes_and_callables():
    assert isinstance(registry.resolve("conformance.reference:Reference"), Reference)
    backend = registry.resolve("examples.plain_callable:attention")
    assert isinstance(backend, CallableBackend) and backend.name == "examples.plain_callable:attention"


def test_file_reference(tmp_path):
    path = tmp_path / "my_kernel.py"
    path.write_text(textwrap.dedent("""
        from conformance.reference import Reference
        class Mine(Reference):
            name = "mine"
        instance = Mine()
    """))
    assert registry.resolve(f"{path}:Mine").name == "mine"
    assert registry.resolve(f"{path}:instance").name == "mine"


def test_entry_points_are_found(monkeypatch):
    ep = importlib.metadata.EntryPoint(name="third-party", value="conformance.reference:Reference", group=registry.ENTRY_POINT_GROUP)
    real = importlib.metadata.entry_points

    def fake(**kwargs):
        if kwargs.get("group") == registry.ENTRY_POINT_GROUP:
            return [ep]
        return real(**kwargs)

    monkeypatch.setattr(importlib.metadata, "entry_points", fake)
    assert "third-party" in registry.known_names()
    assert isinstance(registry.resolve("third-party"), Reference)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no-such-backend", "unknown backend 'no-such-backend'"),
        ("conformance.reference:Nope", "has no attribute 'Nope'"),
        ("missing/file.py:fn", "does not exist"),
        ("conformance.reference:torch", "neither a Backend nor a callable"),
    ],
)
def test_bad_references_say_what_is_wrong(spec, message):
    with pytest.raises((ValueError, ImportError), match=message):
        registry.resolve(spec)


def test_adapter_that_fails_to_import_is_unavailable_with_the_reason(monkeypatch):
    monkeypatch.setitem(registry.BUILTIN, "broken", "backends.does_not_exist:Broken")
    backend = registry.resolve("broken")
    assert isinstance(backend, Backend)
    assert "failed to import" in backend.unavailable_reason("cpu")
