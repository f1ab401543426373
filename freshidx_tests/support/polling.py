"""Polling with a deadline: the only way tests wait for something."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll_until(
    fn: Callable[[], T | None], *, timeout: float, interval: float = 0.25, what: str = "condition"
) -> T:
    """Call ``fn`` until it returns a truthy value; return it. Raises TimeoutError with ``what``."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = fn()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what} (last value: {last!r})")
        time.sleep(interval)
