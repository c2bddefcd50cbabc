"""pytest plumbing of the spec: backend selection, device, hypothesis profiles, expected failures.

Loaded by the project's conftest.py and by ``jfa-conformance run`` (``-p conformance.plugin``).
Options: ``--backend`` (repeatable), ``--device``, ``--xfails-file``, ``--max-examples``; the hypothesis
profile comes from hypothesis's own ``--hypothesis-profile`` (default ``ci``, see profiles.py).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis.errors import Unsatisfiable

from . import profiles
from .checklog import CheckLog

# Report records, --dtype, crash/timeout diagnosis under xdist (inactive unless its options are given).
pytest_plugins = ["conformance.recorder"]


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def pytest_addoption(parser):
    group = parser.getgroup("jfa-conformance", "jagged flash attention conformance")
    group.addoption(
        "--backend", action="append", default=[], metavar="NAME",
        help="backend to test: a built-in or entry-point name, 'package.module:attr' or 'file.py:attr' "
        "(repeatable; default: every backend available on --device)",
    )
    group.addoption("--device", default=None, help="device the backends run on (default: cuda if available, else cpu)")
    group.addoption(
        "--xfails-file", default=None, metavar="PATH",
        help="file of node-id substrings, one per line ('# reason' allowed): matching checks are expected failures",
    )
    group.addoption("--max-examples", type=int, default=None, help="override the profile's hypothesis max_examples")
    group.addoption("--jfa-only", default=None, metavar="PATH",
                    help="run only the spec checks whose ids are listed in PATH, one per line (see check_key)")


@pytest.hookimpl(trylast=True)  # after hypothesis's own plugin has loaded --hypothesis-profile
def pytest_configure(config):
    config.addinivalue_line("markers", "spec: a conformance check of the spec, run per backend")
    chosen = config.getoption("hypothesis_profile", default=None) or profiles.DEFAULT
    profiles.load(chosen, config.getoption("max_examples"))


def selected_backends(config):
    """``(backend, skip_reason)`` pairs for the run: explicit names, or every available backend."""
    from backends import registry

    device = config.getoption("device") or default_device()
    names = config.getoption("backend")
    if not names:
        return [(b, None) for b in registry.available(device)]
    chosen = []
    for name in names:
        backend = registry.resolve(name)
        chosen.append((backend, backend.unavailable_reason(device)))
    return chosen


def pytest_generate_tests(metafunc):
    if "backend" not in metafunc.fixturenames:
        return
    if not hasattr(metafunc.config, "_jfa_backends"):
        metafunc.config._jfa_backends = selected_backends(metafunc.config)
    params = [
        pytest.param(b, id=b.name, marks=[pytest.mark.skip(reason=f"{b.name} unavailable: {why}")] if why else [])
        for b, why in metafunc.config._jfa_backends
    ]
    metafunc.parametrize("backend", params)


def read_xfails(path: str | Path) -> list[tuple[str, str]]:
    """``(node-id substring, reason)`` pairs; blank lines and full-line comments are ignored."""
    entries = []
    for line in Path(path).read_text().splitlines():
        pattern, _, reason = line.partition("#")
        if pattern.strip():
            entries.append((pattern.strip(), reason.strip() or "listed in the expected-failures file"))
    return entries


# The spec's modules in the order they run: the oracle checks first, so that a run cut short (time limit,
# stopped job) has the verdicts that matter most; xdist hands checks out in this order.
SPEC_ORDER = ("test_oracle_checks", "test_edge_cases", "test_metamorphic", "test_unwritten_memory", "test_determinism")


def _spec_rank(item) -> int:
    module = item.path.stem if getattr(item, "path", None) is not None else ""
    return SPEC_ORDER.index(module) if module in SPEC_ORDER else len(SPEC_ORDER)


def check_key(nodeid: str) -> str:
    """A spec check's id without the folder the spec was collected from (it depends on the install):
    ``test_oracle_checks.py::test_forward[fa4]``."""
    path, sep, rest = nodeid.partition("::")
    return path.replace("\\", "/").rsplit("/", 1)[-1] + sep + rest


def pytest_collection_modifyitems(config, items):
    items.sort(key=_spec_rank)  # stable: the order within a module is kept
    only = config.getoption("jfa_only")
    if only:
        wanted = {line.strip() for line in Path(only).read_text().splitlines() if line.strip()}
        deselected = [item for item in items if check_key(item.nodeid) not in wanted]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if check_key(item.nodeid) in wanted]
    path = config.getoption("xfails_file")
    if not path:
        return
    entries = read_xfails(path)
    for item in items:
        for pattern, reason in entries:
            if pattern in item.nodeid:
                item.add_marker(pytest.mark.xfail(reason=reason, strict=False))
                break


@pytest.fixture
def device(request) -> str:
    return request.config.getoption("device") or default_device()


CHECK_LOG = pytest.StashKey[CheckLog]()


@pytest.fixture
def check(request, backend) -> CheckLog:
    """The check's log; spec tests record every example's verdicts through ``check.verify``."""
    log = CheckLog(backend=backend.name)
    request.node.stash[CHECK_LOG] = log
    return log


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    except Unsatisfiable:
        # Every drawn example was unsupported: the check is unsupported, with the reasons seen.
        log = item.stash.get(CHECK_LOG, None)
        pytest.skip(f"unsupported: {log.unsupported_summary() if log else 'no supported example'}")
