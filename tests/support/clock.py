"""A clock the tests move by hand (the server's `clock=` parameter)."""

from __future__ import annotations


class FakeClock:
    """An injectable clock (epoch ns) that tests move by hand."""

    def __init__(self, now_ns: int) -> None:
        self.now_ns = now_ns

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, seconds: float) -> None:
        """Move the clock forward."""
        self.now_ns += int(seconds * 1_000_000_000)
