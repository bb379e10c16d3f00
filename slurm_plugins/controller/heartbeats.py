"""The controller's heartbeat receiver: one UDP socket, one thread, authenticated beats handed to the detector.

Why a thread of its own: datagrams must be read as they arrive (a beat read late makes its node look silent); the
detector loop takes what has queued up with ``drain()`` every tick. The detector also calls ``pump()`` before it
takes the time it judges at: a controller descheduled for a second (a busy host) wakes with beats still in the
kernel's buffer that its thread has not read yet, and judging without them declared live nodes lost (seen in CI:
4 nodes at once, their agents beating all along).

Surviving a flood (junk, forged MACs, replays from anyone who can reach the port):

- the socket is drained in bursts (poll once, then read until the queue is empty) with a receive buffer of
  ``RCVBUF_BYTES`` (``SO_RCVBUFFORCE`` when we may, else ``SO_RCVBUF`` up to the kernel's ``rmem_max``), so a burst
  queues instead of being dropped;
- every datagram costs at most one size check, one split and one MAC before it is refused (``handle``: no JSON is
  parsed before the MAC matched, no exception is raised on the reject path, a replay of a datagram already seen is
  refused before the MAC, and the MAC is keyed BLAKE2b from a per-node keyed hasher); each node's key is derived
  from the master (``NodeKeys``), so a key learnt on one node forges beats for that node only;
- rejects are counted by reason (``bad_mac``, ``unknown_node``, ``replay``, ``clock_skew``, ``too_big``,
  ``malformed``) and logged at most once per source address and reason per minute, for at most ``LOG_SOURCES``
  sources (spoofed addresses cannot grow memory), plus one summary line a minute while rejects keep coming;
- ``kernel_drops()`` reads the socket's drop counter from ``/proc/net/udp``: the detector declares nobody lost while
  the kernel is dropping datagrams (a silent node may only have had its beats dropped; see ``detection.py``).

Time: a beat's ``received`` is monotonic (silence is judged on it); ``received_wall`` is for records. The freshness
check (``ReplayGuard``'s skew) compares the beat's send time with the wall clock as it was when the receiver
started, advanced by the monotonic clock: a step of the controller's wall clock neither refuses good beats nor
admits old ones.
"""

from __future__ import annotations

import hmac
import logging
import os
import select
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable

from nuro.protocol.heartbeat import (
    MAC_LEN,
    MAX_DATAGRAM,
    NODE_BYTES,
    BadHeartbeat,
    KeyLookup,
    NodeKeys,
    Replay,
    ReplayGuard,
    parse_body,
)
from nuro.protocol.heartbeat import mac as hb_mac
from nuro.slurm_plugins.controller.liveness import Beat
from nuro.slurm_plugins.controller.progress import ProgressBook
from nuro.slurm_plugins.controller.ratelog import RateLog

log = logging.getLogger(__name__)

REJECT_LOG_EVERY_S = 60.0
LOG_SOURCES = 256
RCVBUF_BYTES = 8 << 20  # ~10,000 small datagrams: a few hundred ms of a flood while the thread is descheduled
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
BURST = 4096  # datagrams read per wake-up before the stop flag is looked at again
SEEN_MACS = 8192  # authentic MACs remembered for the replay short-cut (a few minutes of a 500-node fleet)


def reject_reason(exc: BadHeartbeat) -> str:
    """The counter a rejected datagram goes to (``nuro.protocol.heartbeat`` raises one exception type with a
    message)."""
    text = str(exc)
    if isinstance(exc, Replay):
        return "clock_skew" if "from our clock" in text else "replay"
    if text.startswith("MAC mismatch"):
        return "bad_mac"
    if text.startswith("unknown node"):
        return "unknown_node"
    if text.startswith("datagram of"):
        return "too_big"
    return "malformed"


def _udp_drops(port: int, inode: int, path: str = "/proc/net/udp") -> int | None:
    """The kernel's drop counter of the UDP socket bound to ``port`` with ``inode`` (None when not found)."""
    want = f":{port:04X}"
    try:
        with open(path, "rb") as fh:
            lines = fh.read(4 << 20).decode("ascii", "replace").splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        cols = line.split()
        if len(cols) >= 13 and cols[1].endswith(want) and cols[9] == str(inode):
            try:
                return int(cols[-1])
            except ValueError:
                return None
    return None


class HeartbeatReceiver:
    """Receives heartbeats on ``(bind, port)`` in a daemon thread; ``drain()`` returns the beats since last call.

    Args:
        bind: address to listen on: the cluster network's address of the controller (the dev cluster: 127.0.0.1).
        port: UDP port (0 = any free port; see ``port`` after construction).
        keys: the master key (``nuro.protocol.heartbeat.load_key``; each node's key is derived from it), or a key
        lookup.
        clock: wall clock (records, and the anchor of the freshness check), injectable for tests.
        monotonic: the clock silence is judged on.
        progress: where each beat's ``commits`` and ``acks`` (jobs' progress) are noted, if anywhere.
    """

    def __init__(
        self,
        bind: str,
        port: int,
        keys: bytes | KeyLookup,
        clock: Callable[[], float] = time.time,
        max_skew_s: float = 30.0,
        monotonic: Callable[[], float] = time.monotonic,
        progress: ProgressBook | None = None,
    ) -> None:
        self.progress = progress
        self.keys: KeyLookup = NodeKeys(keys) if isinstance(keys, bytes) else keys
        self.clock = clock
        self.monotonic = monotonic
        self.guard = ReplayGuard(max_skew_s=max_skew_s)
        self.accepted = 0
        self.rejects: Counter[str] = Counter()
        self._beats: list[Beat] = []
        self._lock = threading.Lock()
        self._rx = threading.Lock()  # one reader at a time: the thread's bursts, or the detector's pump()
        self._logs = RateLog(REJECT_LOG_EVERY_S, LOG_SOURCES, clock=monotonic)
        self._summary = RateLog(REJECT_LOG_EVERY_S, 1, clock=monotonic)
        self._summary_base: Counter[str] = Counter()
        self._log_checked: dict[str, float] = {}
        self._seen: set[bytes] = set()
        self._stop = threading.Event()
        self._wall0, self._mono0 = clock(), monotonic()
        self._sock = socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET, socket.SOCK_DGRAM)
        self.rcvbuf = self._grow_buffer()
        self._sock.bind((bind, port))
        self._sock.setblocking(False)
        self.port = self._sock.getsockname()[1]
        self._inode = os.fstat(self._sock.fileno()).st_ino
        self._poll = select.poll()
        self._poll.register(self._sock.fileno(), select.POLLIN)
        self._thread = threading.Thread(target=self._run, name="heartbeat-receiver", daemon=True)

    def _grow_buffer(self) -> int:
        for opt in (SO_RCVBUFFORCE, socket.SO_RCVBUF):  # FORCE ignores rmem_max, and needs CAP_NET_ADMIN
            try:
                self._sock.setsockopt(socket.SOL_SOCKET, opt, RCVBUF_BYTES)
                break
            except OSError:
                continue
        return self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)

    def start(self) -> HeartbeatReceiver:
        self._thread.start()
        host, port = self._sock.getsockname()[:2]
        log.info("heartbeat receiver listening on udp %s:%d (receive buffer %d bytes)", host, port, self.rcvbuf)
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the thread and close the socket (joins: the thread exits within 0.2 s)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self._sock.close()

    def pump(self, limit: int = BURST) -> int:
        """Read and handle what the kernel holds now (at most ``limit`` datagrams), from the caller's thread.

        Returns the datagrams read. Bounded, so a flood cannot hold the detector (the kernel drop counter covers the
        rest: see ``kernel_drops``).
        """
        return self._read_burst(limit)

    def _read_burst(self, limit: int) -> int:
        read = 0
        with self._rx:
            while read < limit:
                try:
                    data, addr = self._sock.recvfrom(MAX_DATAGRAM + 1)
                except (BlockingIOError, InterruptedError):
                    break
                read += 1
                try:
                    self.handle(data, addr[0])
                except Exception:  # a bug in one datagram's handling must not end the reading
                    log.exception("heartbeat receiver: unexpected error (continuing)")
        return read

    def drain(self) -> list[Beat]:
        """Beats accepted since the previous call, in arrival order."""
        with self._lock:
            beats, self._beats = self._beats, []
        return beats

    def reference_wall(self, mono: float | None = None) -> float:
        """The wall clock as it was at start, advanced by the monotonic clock (immune to wall-clock steps)."""
        return self._wall0 + ((self.monotonic() if mono is None else mono) - self._mono0)

    def handle(self, data: bytes, source: str) -> Beat | None:
        """Verify one datagram; queue and return the beat, or count the reject and return None.

        The checks run cheapest first and raise nothing on the reject path (a flood is mostly rejects): size, shape,
        a MAC already seen (a replay, refused without an HMAC), the node name, then one HMAC; only an authentic
        datagram is parsed (``nuro.protocol.heartbeat.parse_body``) and checked for freshness.
        """
        mono = self.monotonic()
        n = len(data)
        if n > MAX_DATAGRAM:
            return self._reject("too_big", source, mono, f"{n} bytes")
        if n < MAC_LEN + 3 or data[MAC_LEN] != 0x2E:
            return self._reject("malformed", source, mono, "not a nuro heartbeat (no MAC prefix)")
        mac = data[:MAC_LEN]
        if mac in self._seen:
            return self._reject("replay", source, mono, "a datagram already received")
        signed = data[MAC_LEN + 1 :]
        sp = signed.find(b" ", 0, 66)
        if sp <= 0 or not NODE_BYTES.fullmatch(signed, 0, sp):
            return self._reject("malformed", source, mono, "not a nuro heartbeat (no node name)")
        node = signed[:sp].decode("ascii")
        key = self.keys(node)
        if key is None:
            return self._reject("unknown_node", source, mono, f"unknown node {node!r}")
        expected = self.keys.mac(node, signed) if isinstance(self.keys, NodeKeys) else hb_mac(key, signed)
        if not hmac.compare_digest(mac, expected):
            return self._reject("bad_mac", source, mono, f"MAC mismatch for {node}: wrong key or altered datagram")
        self._remember(mac)
        try:
            hb = parse_body(node, signed[sp + 1 :])
            self.guard.check(hb, self.reference_wall(mono))
        except BadHeartbeat as exc:
            return self._reject(reject_reason(exc), source, mono, str(exc))
        beat = Beat(hb.node, hb.boot, hb.seq, hb.sent, mono, hb.healthy, hb.problems, received_wall=self.clock(),
                    stopping_s=hb.stopping_s, suspect_jobs=hb.suspect_jobs, throttled=hb.throttled,
                    stragglers=hb.stragglers)  # fmt: skip
        with self._lock:
            self._beats.append(beat)
            self.accepted += 1
        if self.progress is not None and (hb.commits or hb.acks):
            self.progress.note(hb.node, hb.commits, hb.acks)
        return beat

    def _remember(self, mac: bytes) -> None:
        """Authentic MACs seen lately (bounded): the same datagram again is a replay, refused before any HMAC."""
        if len(self._seen) >= SEEN_MACS:
            self._seen.clear()
        self._seen.add(mac)

    def _reject(self, reason: str, source: str, mono: float, detail: str) -> None:
        self.rejects[reason] += 1
        if mono - self._log_checked.get(reason, float("-inf")) < 1.0:
            return None  # at most one logging decision per reason per second: a flood costs a counter increment
        self._log_checked[reason] = mono
        allowed, suppressed = self._logs.allow((source, reason))
        if allowed:
            log.warning(
                "heartbeat rejected source=%s reason=%s total=%d detail=%s (logged once a minute per source%s)",
                source, reason, self.rejects[reason], detail[:200], f"; {suppressed} more since" if suppressed else "",
            )  # fmt: skip
        if self._summary.allow("summary")[0]:
            delta = self.rejects - self._summary_base
            if sum(delta.values()) > 1:
                log.warning("heartbeat rejects since the last summary: %s", dict(sorted(delta.items())))
            self._summary_base = Counter(self.rejects)
        return None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if not self._poll.poll(200):
                    continue
                self._read_burst(BURST)
            except OSError as exc:
                if self._stop.is_set():
                    return
                log.warning("heartbeat socket error (continuing): %s", exc)
                time.sleep(0.1)
            except Exception:  # a bug in one datagram's handling must not end the receiver
                log.exception("heartbeat receiver: unexpected error (continuing)")

    def kernel_drops(self) -> int | None:
        """Datagrams the kernel dropped on this socket since it was opened (buffer full), or None if unknown."""
        return _udp_drops(self.port, self._inode, "/proc/net/udp6" if self._sock.family == socket.AF_INET6 else
                          "/proc/net/udp")  # fmt: skip

    def stats(self) -> dict[str, int]:
        drops = self.kernel_drops()
        return {
            "accepted": self.accepted,
            **{f"rejected_{k}": v for k, v in sorted(self.rejects.items())},
            **({"kernel_drops": drops} if drops is not None else {}),
        }
