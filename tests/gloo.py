"""Run a script as two real gloo ranks on this machine (unit tests of code that needs a process group)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path


def free_port() -> int:
    """A TCP port no one listens on now, chosen by the kernel (bind to port 0): other sessions and shards run their
    own groups on this machine, and a port derived from the pid collided with them (EADDRINUSE on 29807)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_ranks(script: Path, *args: str, timeout_s: float = 180.0) -> list[str]:
    """Start ``script`` as ranks 0 and 1 (torchrun's variables, a free port on 127.0.0.1) and return each rank's last
    stdout line; fails the test with both ranks' output when either exits non-zero."""
    base = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
            "GLOO_SOCKET_IFNAME": "lo", "NURO_PG_TIMEOUT_S": "30"}  # fmt: skip
    procs = [subprocess.Popen([sys.executable, str(script), *args], env={**base, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]  # fmt: skip
    outs = [p.communicate(timeout=timeout_s) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    return [o[0].strip().splitlines()[-1] for o in outs]
