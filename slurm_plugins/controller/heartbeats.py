"""The controller's heartbeat receiver: one UDP socket, one thread, authenticated beats handed to the detector.

Why a thread of its own: datagrams must be read as they arrive (the kernel's socket buffer is small, and a beat read
late makes its node look silent); the detector loop takes what has queued up with ``drain()`` every tick.

Each datagram is decoded and verified with ``nuro.heartbeat`` (HMAC, then ``ReplayGuard`` for freshness). Rejects
are counted by reason (``bad_mac``, ``replay``, ``clock_skew``, ``malformed``) and logged at most once per source
address and reason per minute: a misconfigured node sending every second must not flood the controller's log.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable

from nuro.heartbeat import MAX_DATAGRAM, BadHeartbeat, Replay, ReplayGuard, decode
from nuro.slurm_plugins.controller.liveness import Beat

log = logging.getLogger(__name__)

REJECT_LOG_EVERY_S = 60.0


def reject_reason(exc: BadHeartbeat) -> str:
    """The counter a rejected datagram goes to (``nuro.heartbeat`` raises one exception type with a message)."""
    text = str(exc)
    if isinstance(exc, Replay):
        return "clock_skew" if "from our clock" in text else "replay"
    if text.startswith("MAC mismatch"):
        return "bad_mac"
    return "malformed"


class HeartbeatReceiver:
    """Receives heartbeats on ``(bind, port)`` in a daemon thread; ``drain()`` returns the beats since last call.

    Args:
        bind: address to listen on ("127.0.0.1" for the dev cluster; "0.0.0.0" or the cluster-network address in
            production, where agents run on other hosts).
        port: UDP port (0 = any free port; see ``port`` after ``start()``).
        key: the shared HMAC key (``nuro.heartbeat.load_key``).
        clock: wall clock, injectable for tests.
    """

    def __init__(
        self, bind: str, port: int, key: bytes, clock: Callable[[], float] = time.time, max_skew_s: float = 30.0
    ) -> None:
        self.key = key
        self.clock = clock
        self.guard = ReplayGuard(max_skew_s=max_skew_s)
        self.accepted = 0
        self.rejects: Counter[str] = Counter()
        self._beats: list[Beat] = []
        self._lock = threading.Lock()
        self._last_logged: dict[tuple[str, str], float] = {}
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)  # a 500-node burst fits
        self._sock.bind((bind, port))
        self._sock.settimeout(0.2)  # so stop() is noticed without a wake-up datagram
        self.port = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._run, name="heartbeat-receiver", daemon=True)

    def start(self) -> HeartbeatReceiver:
        self._thread.start()
        log.info("heartbeat receiver listening on udp %s:%d", *self._sock.getsockname())
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the thread and close the socket (joins: the thread exits within 0.2 s)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self._sock.close()

    def drain(self) -> list[Beat]:
        """Beats accepted since the previous call, in arrival order."""
        with self._lock:
            beats, self._beats = self._beats, []
        return beats

    def handle(self, data: bytes, source: str) -> Beat | None:
        """Verify one datagram; queue and return the beat, or count the reject and return None."""
        now = self.clock()
        try:
            hb = decode(data, self.key)
            self.guard.check(hb, now)
        except BadHeartbeat as exc:
            reason = reject_reason(exc)
            self.rejects[reason] += 1
            last = self._last_logged.get((source, reason))
            if last is None or now - last >= REJECT_LOG_EVERY_S:
                self._last_logged[(source, reason)] = now
                log.warning(
                    "heartbeat rejected source=%s reason=%s total=%d detail=%s (logged once a minute per source)",
                    source, reason, self.rejects[reason], exc,
                )  # fmt: skip
            return None
        beat = Beat(hb.node, hb.boot, hb.seq, hb.sent, now, hb.healthy, hb.problems)
        with self._lock:
            self._beats.append(beat)
            self.accepted += 1
        return beat

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data, addr = self._sock.recvfrom(MAX_DATAGRAM + 64)
            except TimeoutError:
                continue
            except OSError as exc:
                if self._stop.is_set():
                    return
                log.warning("heartbeat socket error (continuing): %s", exc)
                time.sleep(0.1)
                continue
            self.handle(data, addr[0])

    def stats(self) -> dict[str, int]:
        return {"accepted": self.accepted, **{f"rejected_{k}": v for k, v in sorted(self.rejects.items())}}
