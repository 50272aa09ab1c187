"""Comparing a case's output with the expected one (every :data:`Comparison` but a
checker, which runs in a sandbox of its own)."""

from __future__ import annotations

import math

from ._model import Comparison, FloatTolerance

__all__ = ("same",)


def same(expected: bytes, output: bytes, comparison: Comparison) -> bool:
    """Whether ``output`` matches ``expected`` under ``comparison``."""
    if comparison == "exact":
        return output == expected
    if comparison == "lines":
        return _lines(output) == _lines(expected)
    if comparison == "whitespace":
        return output.split() == expected.split()
    if isinstance(comparison, FloatTolerance):
        got, wanted = output.split(), expected.split()
        return len(got) == len(wanted) and all(
            _close(a, b, comparison) for a, b in zip(got, wanted, strict=True)
        )
    raise AssertionError(f"no comparison of outputs for {comparison!r}")


def _lines(data: bytes) -> list[bytes]:
    lines = [line.rstrip() for line in data.split(b"\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _close(a: bytes, b: bytes, tolerance: FloatTolerance) -> bool:
    if a == b:
        return True
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return math.isclose(x, y, rel_tol=tolerance.rel, abs_tol=tolerance.abs)
