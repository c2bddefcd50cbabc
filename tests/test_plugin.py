"""The pytest plugin: expected-failures files and backend selection."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conformance.plugin import read_xfails

ROOT = Path(__file__).resolve().parents[1]


def test_read_xfails_parses_patterns_and_reasons(tmp_path):
    path = tmp_path / "xfails.txt"
    path.write_text("# comment line\n\ntest_edge_case[x-  # known bug 12\ntest_lse\n")
    assert read_xfails(path) == [("test_edge_case[x-", "known bug 12"), ("test_lse", "listed in the expected-failures file")]


def test_xfails_file_turns_known_failures_into_expected_failures(tmp_path):
    xfails = tmp_path / "xfails.txt"
    xfails.write_text("causal_more_keys_than_queries  # top-left alignment, tracked upstream\n"
                      "causal_more_queries_than_keys\nbroadcast_q_causal\n")
    cmd = [sys.executable, "-m", "pytest", "conformance/spec", "-q", "-p", "no:cacheprovider", "-k", "test_edge_case",
           "--backend", "examples/plain_callable.py:attention_top_left", "--xfails-file", str(xfails)]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:]
    assert "xfailed" in result.stdout


def test_unavailable_explicit_backend_is_skipped_with_its_reason():
    cmd = [sys.executable, "-m", "pytest", "conformance/spec", "-q", "-p", "no:cacheprovider", "-rs",
           "-k", "test_forward", "--backend", "fa4", "--device", "cpu"]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "fa4 unavailable" in result.stdout, result.stdout[-2000:]


def test_the_oracle_checks_are_collected_first_so_a_cut_short_run_has_them():
    cmd = [sys.executable, "-m", "pytest", "conformance/spec", "--backend", "reference", "--collect-only", "-q"]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    ids = [line for line in result.stdout.splitlines() if "::" in line]
    modules = [i.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py") for i in ids]
    first_seen = list(dict.fromkeys(modules))
    # no measured seconds: the drawn checks first (check_order.py), the oracle's first among them
    assert first_seen[0] == "test_oracle_checks", first_seen
    assert modules == sorted(modules, key=first_seen.index), "each module's checks stay together"
