"""The controller's third loop (Slurm 25.11+): slurmctld's OpenMetrics → one ``slurmctld`` point per interval.

Why in the controller: it already runs beside slurmctld with the admin's credentials, and its own loops stay
independent (own thread, own error handling: a slurmctld that answers no HTTP never slows the policy cycle or the
failure detector). Points go through a ``BufferedWriter``, so a slow or absent metrics sink never blocks a scrape.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from nuro.metrics.model import SLURMCTLD, InvalidPoint, Point
from nuro.slurm.openmetrics import OpenMetricsError, scrape
from nuro.slurm_plugins.controller.ratelog import RateLog

log = logging.getLogger(__name__)


class SlurmMetricsLoop:
    """Scrape ``url`` every ``interval_s`` and hand the point to ``add`` (a ``BufferedWriter.add``); the point's
    ``controller`` tag is the URL's host:port (which slurmctld)."""

    def __init__(
        self,
        url: str,
        add: Callable[[Point], object],
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.time,
        fetch: Callable[[str], dict[str, float | int]] = scrape,
    ) -> None:
        self.url, self.add, self.interval_s = url, add, interval_s
        self.controller = urlsplit(url).netloc
        self.clock, self.fetch = clock, fetch
        self.scrapes = 0
        self.failures = 0
        self._errors = RateLog(every_s=60.0)

    def once(self) -> Point | None:
        """One scrape; the point written, or None when slurmctld could not be read (logged once a minute)."""
        try:
            fields = self.fetch(self.url)
            point = Point(SLURMCTLD, {"controller": self.controller}, fields, int(self.clock() * 1e9))
        except (OpenMetricsError, InvalidPoint) as exc:
            self.failures += 1
            write, suppressed = self._errors.allow("scrape")
            if write:
                log.warning("slurmctld metrics not read failures=%d suppressed=%d: %s", self.failures, suppressed, exc)
            return None
        self._errors.forget("scrape")
        self.add(point)
        self.scrapes += 1
        return point

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            self.once()
            stop.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))
