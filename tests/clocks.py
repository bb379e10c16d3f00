"""A fake monotonic clock for unit tests of code that waits: sleeping advances it, nothing really sleeps."""

from __future__ import annotations


class SleepClock:
    """Call it for the time; pass ``sleep`` where the code under test sleeps."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s
