"""The node agent → controller heartbeat: one authenticated UDP datagram per node per interval.

Why UDP and HMAC: a heartbeat must cost nothing on a 500-node fleet and must never block the agent (a hung TCP
connect to a restarting controller would look like a dead node). Each datagram is self-contained JSON plus an
HMAC-SHA256 over its exact bytes with a key shared by the controller and the nodes (root-only file), so a user on a
compute node cannot keep a dead node "alive" or declare a healthy one dead. Replays are refused by the receiver
(``Replay``): per node, a datagram must carry a newer ``(boot, seq)`` than the last accepted one, and its send time
must be within ``max_skew_s`` of the receiver's clock.

Wire format (bytes): ``<hex hmac>.<json>`` where json is compact, sorted, and holds
``v`` (format), ``node``, ``boot`` (agent start time, ms: a restarted agent starts a new sequence), ``seq``,
``sent`` (Unix s), ``healthy`` (bool: the agent's last probe passed), ``problems`` (short texts when not healthy).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

FORMAT = 1
MAX_DATAGRAM = 1400  # stays inside one Ethernet frame: no IP fragmentation
DEFAULT_INTERVAL_S = 1.0
DEFAULT_MISS_LIMIT = 3  # intervals of silence before a node is declared lost
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def is_node_name(name: str) -> bool:
    """A Slurm node name nuro accepts (also a safe path component: no '/', no leading '.')."""
    return bool(_NODE.fullmatch(name))


class BadHeartbeat(ValueError):
    """A datagram that is not a valid, authentic heartbeat; the message says which check failed."""


class Replay(BadHeartbeat):
    """Authentic but not newer than the last accepted heartbeat of that node (or too far from our clock)."""


@dataclass(frozen=True)
class Heartbeat:
    node: str
    boot: int
    seq: int
    sent: float
    healthy: bool = True
    problems: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not is_node_name(self.node):
            raise BadHeartbeat(f"node name {self.node!r} is not a valid Slurm node name")
        if self.seq < 0 or self.boot < 0:
            raise BadHeartbeat("boot and seq must be non-negative")


def load_key(path: str | Path) -> bytes:
    """The shared secret from a file (whitespace stripped). Refuses an empty key or one others can read."""
    path = Path(path)
    try:
        st = path.stat()
        raw = path.read_bytes().strip()
    except FileNotFoundError:
        raise BadHeartbeat(f"heartbeat key file {path} does not exist (nuro-admin devcluster up writes one)") from None
    if st.st_mode & 0o077:
        mode = oct(st.st_mode & 0o777)
        raise BadHeartbeat(f"heartbeat key file {path} is readable by others (mode {mode}): chmod 600 it")
    if len(raw) < 16:
        raise BadHeartbeat(f"heartbeat key in {path} is shorter than 16 bytes")
    return raw


def write_key(path: str | Path) -> bytes:
    """Create a random key file (mode 600) unless one exists; return the key."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(os.urandom(32).hex() + "\n")
    return load_key(path)


def encode(hb: Heartbeat, key: bytes) -> bytes:
    body = json.dumps(
        {"v": FORMAT, **{k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(hb).items()}},
        separators=(",", ":"),
        sort_keys=True,
    ).encode()
    mac = hmac.new(key, body, hashlib.sha256).hexdigest().encode()
    data = mac + b"." + body
    if len(data) > MAX_DATAGRAM:
        raise BadHeartbeat(f"heartbeat of {len(data)} bytes exceeds {MAX_DATAGRAM}: shorten the problem texts")
    return data


def decode(data: bytes, key: bytes) -> Heartbeat:
    """Verify and parse one datagram. Raises BadHeartbeat (never anything else) on any defect."""
    mac, sep, body = data.partition(b".")
    if not sep or len(mac) != 64:
        raise BadHeartbeat("not a nuro heartbeat (no MAC prefix)")
    expected = hmac.new(key, body, hashlib.sha256).hexdigest().encode()
    if not hmac.compare_digest(mac, expected):
        raise BadHeartbeat("MAC mismatch: wrong key or altered datagram")
    try:
        raw = json.loads(body)
        if raw.get("v") != FORMAT:
            raise BadHeartbeat(f"heartbeat format {raw.get('v')!r}, expected {FORMAT}")
        return Heartbeat(
            node=str(raw["node"]),
            boot=int(raw["boot"]),
            seq=int(raw["seq"]),
            sent=float(raw["sent"]),
            healthy=bool(raw.get("healthy", True)),
            problems=tuple(str(p) for p in raw.get("problems", ())),
        )
    except BadHeartbeat:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BadHeartbeat(f"malformed heartbeat body: {exc}") from None


@dataclass
class ReplayGuard:
    """Receiver-side freshness: accept a node's heartbeat only if its (boot, seq) is newer and its clock is near."""

    max_skew_s: float = 30.0
    _last: dict[str, tuple[int, int]] = field(default_factory=dict)

    def check(self, hb: Heartbeat, now: float) -> None:
        if abs(hb.sent - now) > self.max_skew_s:
            raise Replay(f"{hb.node}: heartbeat sent {hb.sent - now:+.1f} s from our clock (limit {self.max_skew_s} s)")
        last = self._last.get(hb.node)
        if last is not None and (hb.boot, hb.seq) <= last:
            raise Replay(f"{hb.node}: (boot {hb.boot}, seq {hb.seq}) is not newer than {last}")
        self._last[hb.node] = (hb.boot, hb.seq)
