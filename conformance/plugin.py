"""pytest plumbing of the spec: backend selection, device, hypothesis profiles, expected failures.

Loaded by the project's conftest.py and by ``jfa-conformance run`` (``-p conformance.plugin``).
Options: ``--backend`` (repeatable), ``--device``, ``--xfails-file``, ``--max-examples``; the hypothesis
profile comes from hypothesis's own ``--hypothesis-profile`` (default ``ci``, see profiles.py). The spec's
checks run longest expected first, in one share per xdist worker (check_order.py, ``--jfa-check-seconds``).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis.errors import Unsatisfiable

from . import containment, profiles
from .checklog import CheckLog
from .configs import KernelConfig, kernel_configs

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
    group.addoption("--jfa-warming", default=None, metavar="DIR",
                    help="the run's warm-up gates (gates.py): a check of a backend whose gate file is in DIR waits "
                    "for it, outside its timeout; such checks go last in each worker's share")
    group.addoption("--jfa-timings-gate", default=None, metavar="PATH",
                    help="the benchmark session started beside the checks (pytest_session.BenchmarkSession): after "
                    "collection, each timed backend's first call, then wait until PATH reads 'go' (or leave on 'stop')")
    group.addoption("--jfa-check-seconds", default=None, metavar="PATH",
                    help="JSON table of the seconds earlier runs measured per check (check_order.py): the longest "
                    "expected run first, in equal shares per xdist worker; without it, drawn checks first")


@pytest.hookimpl(trylast=True)  # after hypothesis's own plugin has loaded --hypothesis-profile
def pytest_configure(config):
    config.addinivalue_line("markers", "spec: a conformance check of the spec, run per backend")
    chosen = config.getoption("hypothesis_profile", default=None) or profiles.DEFAULT
    profiles.load(chosen, config.getoption("max_examples"))


def selected_backends(config):
    """``(backend, skip_reason)`` pairs for the run: explicit names, or every available backend."""
    from . import registry

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


def pytest_collection_finish(session):
    """With --jfa-timings-gate: the timed backends' first calls (``benchmarks.prelude``), then the wait for the
    checks to end; what was done and when goes to the gate's ``.timings-setup.json`` beside it."""
    path = session.config.getoption("jfa_timings_gate")
    if not path:
        return
    import json
    import os
    import time

    from . import benchmarks
    from .pytest_session import TIMINGS_SETUP
    gate, parent = Path(path), os.getppid()
    device = session.config.getoption("device") or default_device()
    backends = [b for b, why in getattr(session.config, "_jfa_backends", ()) if why is None]
    limit = session.config.getoption("timeout", default=None)  # pytest-timeout's, which each timing keeps to
    prelude = benchmarks.prelude(backends, device, float(limit) if limit else None) if session.items else {}
    ready_at = time.time()
    while (verdict := gate.read_text().strip() if gate.exists() else "stop") not in ("go", "stop"):
        if os.getppid() != parent:  # the run that started this session is gone: nobody will open the gate
            verdict = "stop"
            break
        time.sleep(0.1)
    noted = {"ready_at": ready_at, "go_at": time.time(), "prelude_s": prelude}
    (gate.parent / TIMINGS_SETUP).write_text(json.dumps(noted))
    if verdict == "stop":
        session.items.clear()  # the run ended without its timings: none is run, none is reported


def read_xfails(path: str | Path) -> list[tuple[str, str]]:
    """``(node-id substring, reason)`` pairs; blank lines and full-line comments are ignored."""
    entries = []
    for line in Path(path).read_text().splitlines():
        pattern, _, reason = line.partition("#")
        if pattern.strip():
            entries.append((pattern.strip(), reason.strip() or "listed in the expected-failures file"))
    return entries


# The spec's modules by importance: the oracle checks first. Checks run longest expected first
# (check_order.py); among equal estimates, such as every drawn check of a run with no measured seconds,
# this order decides, so that a run cut short still has the verdicts that matter most.
SPEC_ORDER = ("test_oracle_checks", "test_edge_cases", "test_metamorphic", "test_unwritten_memory", "test_determinism",
              "test_kernel_configs")


def _spec_rank(item) -> int:
    module = item.path.stem if getattr(item, "path", None) is not None else ""
    return SPEC_ORDER.index(module) if module in SPEC_ORDER else len(SPEC_ORDER)


def check_key(nodeid: str) -> str:
    """A spec check's id without the folder the spec was collected from (it depends on the install):
    ``test_oracle_checks.py::test_forward[fa4]``."""
    path, sep, rest = nodeid.partition("::")
    return path.replace("\\", "/").rsplit("/", 1)[-1] + sep + rest


@pytest.hookimpl(trylast=True)  # after -k, -m and --deselect: the order is of the items that run
def pytest_collection_modifyitems(config, items):
    only = config.getoption("jfa_only")
    if only:
        wanted = {line.strip() for line in Path(only).read_text().splitlines() if line.strip()}
        deselected = [item for item in items if check_key(item.nodeid) not in wanted]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if check_key(item.nodeid) in wanted]
    arrange_items(config, items)
    arrange_timings(items)
    path = config.getoption("xfails_file")
    if not path:
        return
    entries = read_xfails(path)
    for item in items:
        for pattern, reason in entries:
            if pattern in item.nodeid:
                item.add_marker(pytest.mark.xfail(reason=reason, strict=False))
                break


def arrange_timings(items) -> None:
    """Order the timings (``benchmarks.py``) shape by shape, each shape's forward then backward on every
    backend in the order they were chosen: a session stopped by the run's time limit then leaves whole
    rows of the cross-backend table, rather than every shape of the first backends and nothing of the last."""
    timed = [i for i, item in enumerate(items) if getattr(item, "originalname", None) == "test_timing"
             and item.path.name == "benchmarks.py"]
    if not timed:
        return
    from .benchmarks import SHAPES
    shape_rank = {name: i for i, name in enumerate(SHAPES)}

    def key(item):
        params = item.callspec.params
        return shape_rank.get(params.get("shape"), len(shape_rank)), params.get("direction") != "forward"

    for i, item in zip(timed, sorted((items[i] for i in timed), key=key)):  # sorted is stable: backends keep
        items[i] = item                                                    # their order within a row


def arrange_items(config, items) -> None:
    """Put the spec's checks (marked ``spec``) in run order (check_order.py): longest expected first, in
    one share per xdist worker; every worker computes the same order from the same table, as xdist
    requires. Other items (the project's own tests, which ``python -m pytest`` collects with the spec)
    follow in their collection order, untouched."""
    from . import check_order

    spec = [item for item in items if item.get_closest_marker("spec")]
    if not spec:
        return
    path = config.getoption("jfa_check_seconds")
    table, first_call = {}, {}
    if path:
        try:
            table, first_call = check_order.read_snapshot(path), check_order.read_snapshot_first_calls(path)
        except ValueError as exc:
            raise pytest.UsageError(f"--jfa-check-seconds: {exc}") from None
    # a backend never measured: its declared compile cost hints at its first call (check_order.py)
    backends = {getattr(b, "name", None): b for b in map(_backend_param, spec)}
    for name, backend in backends.items():
        prior = check_order.first_call_prior(getattr(getattr(backend, "capabilities", None), "compile_s", None))
        if name is not None and name not in first_call and prior:
            first_call[name] = prior
    workers = _xdist_workers(config)
    order = check_order.arrange([_as_check(item) for item in spec], table, workers, first_call)
    gates = config.getoption("jfa_warming")
    if gates:  # the checks that would wait for the warm-up go last in each share
        from .gates import gated_backends
        waiting = gated_backends(Path(gates))
        order = check_order.gated_last(order, [getattr(_backend_param(item), "name", None) in waiting for item in spec],
                                       workers)
    items[:] = [spec[i] for i in order] + [item for item in items if not item.get_closest_marker("spec")]


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outside pytest-timeout's timer: waiting is not checking
def pytest_runtest_protocol(item, nextitem):
    gates = item.config.getoption("jfa_warming", default=None)
    name = getattr(_backend_param(item), "name", None)
    if gates and name is not None:
        from .recorder import note_waiting
        from .gates import gate_path, wait_for_gate
        if gate_path(Path(gates), name).exists():
            note_waiting(item.config, name)
            wait_for_gate(Path(gates), name)
    return (yield)


def _xdist_workers(config) -> int:
    """The shares to deal the checks into: the workers of an xdist ``worksteal`` run (it first cuts the
    item list into one run per worker); 1 outside xdist and for its other modes, which hand the list out
    from its head and are best served longest first."""
    workerinput = getattr(config, "workerinput", None)  # set in xdist's worker processes only
    if not workerinput or workerinput.get(_DIST_KEY) != "worksteal":
        return 1
    return int(workerinput["workercount"])


_DIST_KEY = "jfa_dist"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist, in the controller, for each worker: pass on the ``--dist`` mode, which a worker's own options
    no longer hold (they say ``no``)."""
    node.workerinput[_DIST_KEY] = node.config.getoption("dist")


def _backend_param(item):
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("backend") if callspec else None


def _as_check(item):
    from hypothesis import is_hypothesis_test

    from .check_order import Check

    backend = _backend_param(item)
    function = getattr(item, "obj", None)
    code = getattr(function, "__code__", None)
    # drawn: a hypothesis test, or one that applies hypothesis's `given` in its body (test_determinism)
    draws = is_hypothesis_test(function) or (code is not None and "given" in code.co_names)
    return Check(check_key(item.nodeid), getattr(backend, "name", None), draws, _spec_rank(item))


@pytest.fixture
def device(request) -> str:
    return request.config.getoption("device") or default_device()


def run_seed(config) -> int:
    """The seed that fixes this run's kernel configurations: hypothesis's seed, 0 for a derandomized run."""
    seed = config.getoption("hypothesis_seed", default=None)
    try:
        return int(seed) if seed is not None else 0
    except ValueError:  # a text seed: a hash that is the same in every process (str hashes are salted)
        import zlib
        return zlib.crc32(str(seed).encode())


def backend_configs(backend, config) -> tuple[KernelConfig, ...] | None:
    """The kernel configurations this run draws for ``backend`` (the same in every worker), or None when
    the profile draws kernel axes freely."""
    cache = config.__dict__.setdefault("_jfa_kernel_configs", {})
    if backend.name not in cache:
        extra = profiles.extra_kernel_configs(config.getoption("hypothesis_profile", default=None))
        cache[backend.name] = None if extra is None else configs_for(backend, run_seed(config), extra)
    return cache[backend.name]


def configs_for(backend, seed: int, extra: int = 0) -> tuple[KernelConfig, ...]:
    """The edge cases' configurations in every declared dtype, then a covering set (configs.py)."""
    from .spec.edge_cases import EDGE_CASES, in_dtype

    caps = backend.capabilities
    seeds = [KernelConfig.of(p) for p in (in_dtype(case, d) for case in EDGE_CASES for d in caps.dtypes) if p]

    def supported(c: KernelConfig) -> bool:
        lengths_k = (6, 9)
        return not backend.not_supported_reasons(c.problem((5, 5) if c.broadcast_q else lengths_k, lengths_k))

    return kernel_configs(caps, seed, seeds=seeds, extra=extra, supported=supported)


@pytest.fixture
def configs(request, backend) -> tuple[KernelConfig, ...] | None:
    """The run's kernel configurations for ``backend``; pass to ``problems(..., configs=configs)``."""
    return backend_configs(backend, request.config)


CHECK_LOG = pytest.StashKey[CheckLog]()


@pytest.fixture
def check(request, backend) -> CheckLog:
    """The check's log; spec tests record every example's verdicts through ``check.verify``."""
    log = CheckLog(backend=backend.name)
    request.node.stash[CHECK_LOG] = log
    return log


_PROBED: set[str] = set()  # suspect backends this process has probed and found answering


def pytest_runtest_setup(item):
    """Hang containment (containment.py): skip a dead backend's check as not-run; probe a suspect one."""
    callspec = getattr(item, "callspec", None)
    backend = callspec.params.get("backend") if callspec else None
    flight_dir = item.config.getoption("jfa_flight_dir", default=None)
    if backend is None or not flight_dir:
        return
    state = containment.read(flight_dir).get(backend.name)
    if state is None:
        return
    if state["state"] == "dead":
        pytest.skip(containment.NOT_RUN_PREFIX + state["why"])
    if backend.name in _PROBED:
        return
    from . import recorder
    from .harness import Unsupported, run_backend

    seconds = containment.probe_seconds(item.config.getoption("timeout", default=None))
    recorder.note_probe(state["why"], seconds)
    configs = backend_configs(backend, item.config) or ()
    device = item.config.getoption("device") or default_device()
    from .harness import DeviceFault
    try:
        with containment.Watchdog(seconds):
            for kernel_config in configs[:3]:
                try:
                    run_backend(backend, kernel_config.problem((4,), (4,)), device,
                                gradients=backend.capabilities.backward)
                    break
                except Unsupported:
                    continue
                except Exception:  # noqa: BLE001 - an answer, even an error, is neither a hang nor a crash
                    break
    except DeviceFault as exc:  # the probe broke the device context too: this process goes after the check
        item.config._jfa_poisoned = True
        why = f"{state['why']}; a probe before this check raised a device error too ({exc})"
        containment.mark(flight_dir, backend.name, "dead", state["why"])
        pytest.skip(containment.NOT_RUN_PREFIX + why)
    finally:
        recorder.note_probe(None, None)
    _PROBED.add(backend.name)


def pytest_runtest_teardown(item):
    """Workers sharing a GPU hand back cached memory they hold beyond their share (containment.py)."""
    containment.release_gpu_memory_over_share(containment.gpu_memory_share())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    except Unsatisfiable:
        # Every drawn example was unsupported: the check is unsupported, with the reasons seen.
        log = item.stash.get(CHECK_LOG, None)
        pytest.skip(f"unsupported: {log.unsupported_summary() if log else 'no supported example'}")
