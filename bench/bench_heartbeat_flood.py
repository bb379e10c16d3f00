"""Heartbeat receive rate under a flood (issue 11, deliverable 8): real beats accepted vs dropped.

The controller's ``HeartbeatReceiver`` listens on loopback in this process; ``--nodes`` genuine senders (one
process, one beat per node per second, each signed with its own node key) beat while ``--flooders`` processes send
junk, forged MACs and replays of genuine datagrams as fast as they can for ``--seconds``. Reported: datagrams the
flood sent, what the receiver processed per second, the kernel's drops on the socket, and the real beats sent vs
accepted (the number that matters: a real beat lost to the flood is a step towards a false "node lost").

    python -m bench.bench_heartbeat_flood [--seconds 5] [--nodes 8] [--flooders 1]
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import time

from bench.common import save
from nuro.protocol.heartbeat import Heartbeat, encode, node_key
from nuro.slurm_plugins.controller.heartbeats import HeartbeatReceiver

MASTER = b"bench-master-key-0123456789abcdef"

FLOOD = r"""
import hashlib, os, socket, sys, time
port, seconds = int(sys.argv[1]), float(sys.argv[2])
replayed = [bytes.fromhex(x) for x in sys.argv[3:]]
forged = []
for i in range(1, 9):
    node = "gpu%03d" % i
    body = ('{"boot":1,"healthy":true,"node":"%s","problems":[],"seq":99999999,"sent":%.3f,"v":2}'
            % (node, time.time())).encode()
    signed = node.encode() + b" " + body
    forged.append(hashlib.blake2b(signed, key=os.urandom(32), digest_size=32).hexdigest().encode() + b"." + signed)
packets = [os.urandom(n) for n in (8, 100, 700, 1400)] + forged + replayed
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setblocking(False)
sent = i = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(2000):
        try:
            s.sendto(packets[i % len(packets)], ("127.0.0.1", port))
            sent += 1
        except BlockingIOError:
            pass
        i += 1
print(sent)
"""

AGENTS = r"""
import socket, sys, time
port, seconds = int(sys.argv[1]), float(sys.argv[2])
beats = [[bytes.fromhex(x) for x in line.split(",")] for line in sys.stdin.read().split()]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sent = 0
start = time.monotonic()
for second in range(int(seconds)):
    for node_beats in beats:
        s.sendto(node_beats[second], ("127.0.0.1", port))
        sent += 1
    time.sleep(max(0.0, start + second + 1 - time.monotonic()))
print(sent)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--flooders", type=int, default=1)
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    rx = HeartbeatReceiver("127.0.0.1", 0, MASTER).start()
    nodes = [f"gpu{i + 1:03d}" for i in range(args.nodes)]
    span = int(args.seconds) + 2
    now = time.time()
    lines = []
    for node in nodes:
        key = node_key(MASTER, node)
        lines.append(",".join(encode(Heartbeat(node, 1, seq + 1, now + seq), key).hex() for seq in range(span)))
    replays = [encode(Heartbeat(n, 0, 1, now), node_key(MASTER, n)).hex() for n in nodes[:4]]
    for r in replays:  # genuine datagrams the receiver has already seen: what a capture replays
        rx.handle(bytes.fromhex(r), "127.0.0.1")
    rx.drain()
    base_rejects, drops0 = sum(rx.rejects.values()), rx.kernel_drops() or 0
    t0 = time.monotonic()
    floods = [
        subprocess.Popen([sys.executable, "-c", FLOOD, str(rx.port), str(args.seconds), *replays],
                         stdout=subprocess.PIPE, text=True)
        for _ in range(args.flooders)
    ]  # fmt: skip
    agents = subprocess.Popen(
        [sys.executable, "-c", AGENTS, str(rx.port), str(args.seconds)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    real_sent = int(agents.communicate("\n".join(lines))[0])
    flood_sent = sum(int(p.communicate()[0]) for p in floods)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # let the receiver drain its backlog
        before = sum(rx.rejects.values()) + rx.accepted
        time.sleep(0.5)
        if sum(rx.rejects.values()) + rx.accepted == before:
            break
    elapsed = time.monotonic() - t0
    accepted = len(rx.drain())
    processed = sum(rx.rejects.values()) - base_rejects + accepted
    drops = (rx.kernel_drops() or 0) - drops0
    rx.stop()
    save(
        "heartbeat_flood",
        {
            "seconds": args.seconds,
            "nodes": args.nodes,
            "flooders": args.flooders,
            "flood_sent": flood_sent,
            "flood_rate_per_s": round(flood_sent / args.seconds),
            "processed": processed,
            "processed_per_s": round(processed / elapsed),
            "kernel_drops": drops,
            "real_beats_sent": real_sent,
            "real_beats_accepted": accepted,
            "real_beats_lost": real_sent - accepted,
            "rejects": dict(rx.rejects),
            "rcvbuf_bytes": rx.rcvbuf,
        },
    )


if __name__ == "__main__":
    main()
