"""The layers: conformance/ (the spec) and kernels/ (the attention library) each stand alone; backends/
sits above both and reaches the spec only through its contract and the entry-point registry."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def imported_packages(folder: str) -> dict[str, set[str]]:
    """Top-level package of every import in ``folder``'s Python files, per file."""
    found = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names
    return found


@pytest.mark.parametrize("folder, forbidden", [("conformance", {"backends", "kernels"}),
                                               ("kernels", {"backends", "conformance"})])
def test_no_import_runs_back_up(folder, forbidden):
    offenders = {path: sorted(names & forbidden) for path, names in imported_packages(folder).items()
                 if names & forbidden}
    assert not offenders, offenders


def test_the_projects_adapters_register_through_entry_points():
    from conformance import registry
    names = registry.known_names()
    assert names[:2] == ["reference", "reference-online"]
    assert {"sdpa", "triton-jfa", "fa4", "flex", "varlen-attn", "flashinfer"} <= set(names)
    assert all(not value.startswith("backends.") for value in registry.BUILTIN.values())


def test_every_package_of_the_project_is_installed():
    # setuptools installs the packages pyproject.toml lists; a subpackage missing there works in an
    # editable checkout and is absent from a wheel
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for top in ("conformance", "backends", "kernels")
             for p in (ROOT / top).rglob("__init__.py")}
    assert found == listed
