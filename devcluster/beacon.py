"""A stand-in node agent for the dev cluster: sends one ``nuro.protocol.heartbeat`` datagram per interval, nothing else.

Why it exists: the real agent (``nuro-nodeagent``, ``nuro.healthcheck.agent``) is written in parallel; until it is
installed the supervisor starts this instead, with the same command line (options it does not implement are
accepted and ignored), so the controller's detector, kill-node and the tests work either way. The supervisor
prefers the real agent as soon as ``nuro.healthcheck.agent`` imports.

    python -m nuro.devcluster.beacon --node gpu001 --controller 127.0.0.1:16850 --key-file etc/heartbeat.key
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import time

from nuro.protocol.heartbeat import DEFAULT_INTERVAL_S, Heartbeat, encode, load_key


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="nuro-devcluster-beacon")
    ap.add_argument("--node", required=True)
    ap.add_argument("--controller", required=True, help="HOST:PORT of the controller's heartbeat receiver")
    ap.add_argument("--key-file", required=True)
    ap.add_argument("--interval-s", type=float, default=DEFAULT_INTERVAL_S)
    for ignored in ("--status-dir", "--probe", "--expect-gpus", "--env-file", "--log-file", "--staging-root"):
        ap.add_argument(ignored, default=None)
    args = ap.parse_args(argv)
    host, _, port = args.controller.rpartition(":")
    key = load_key(args.key_file)
    boot = int(time.time() * 1000)
    stop = False

    def on_term(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    seq = 0
    next_at = time.monotonic()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        while not stop:
            seq += 1
            try:
                sock.sendto(encode(Heartbeat(args.node, boot, seq, time.time()), key), (host, int(port)))
            except OSError as exc:  # controller down or network hiccup: keep beating
                print(f"beacon {args.node}: send failed: {exc}", file=sys.stderr, flush=True)
            next_at += args.interval_s
            time.sleep(max(0.0, next_at - time.monotonic()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
