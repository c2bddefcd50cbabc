"""Helpers shared by the spec's test modules."""
from __future__ import annotations

import contextlib

import pytest
from hypothesis import reject

from conformance.harness import Unsupported


@contextlib.contextmanager
def supported(check):
    """Turn an :class:`Unsupported` example into a rejected draw, remembering the reason in the check log."""
    try:
        yield
    except Unsupported as exc:
        check.add_unsupported(str(exc))
        reject()


def require(condition: bool, reason: str) -> None:
    """Skip a whole check the backend declares it does not support."""
    if not condition:
        pytest.skip(f"unsupported: {reason}")
