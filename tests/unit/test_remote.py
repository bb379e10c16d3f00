"""``nuro.remote`` without sshd: the failures that happen before SSH starts must come back typed and bounded in
time (a refused port, a silent server, an unknown name), and the value types behave. The SSH paths (auth, host
keys, timeouts, exit codes) run against real sshd in tests/integration/test_nodes_ssh.py."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nuro import remote
from nuro.remote import Host, HostUnreachable, NonZeroExit, RemoteError, RunResult


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def silent_server() -> Iterator[int]:
    """Accepts TCP connections and never says anything (a hung sshd, a firewall that accepts)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join()
    for c in conns:
        c.close()
    srv.close()


def test_refused_port_is_unreachable_at_once(tmp_path: Path) -> None:
    host = Host("n1", "127.0.0.1", _free_port(), known_hosts=tmp_path / "kh")
    t0 = time.monotonic()
    with pytest.raises(HostUnreachable, match="Connection refused") as info:
        remote.run(host, "true", timeout_s=30)
    assert time.monotonic() - t0 < 10  # refused is final: no waiting out the 30 s timeout
    assert info.value.host == "n1" and info.value.kind == "unreachable"
    assert str(info.value).startswith("n1: cannot connect to 127.0.0.1:")


def test_silent_server_is_unreachable_within_the_timeout(silent_server: int, tmp_path: Path) -> None:
    host = Host("n2", "127.0.0.1", silent_server, known_hosts=tmp_path / "kh")
    t0 = time.monotonic()
    with pytest.raises(HostUnreachable):
        remote.run(host, "true", timeout_s=1.0)
    assert time.monotonic() - t0 < 10  # bounded by the 1 s timeout (paramiko's own banner wait is 15 s)


def test_unknown_name_is_unreachable(tmp_path: Path) -> None:
    with pytest.raises(HostUnreachable, match="cannot connect"):
        remote.run(Host("n3", "no-such-host.invalid"), "true", timeout_s=2)


def test_fetch_shares_the_error_types(tmp_path: Path) -> None:
    with pytest.raises(HostUnreachable):
        remote.fetch(Host("n1", "127.0.0.1", _free_port()), {"/etc/hostname": tmp_path / "x"}, timeout_s=2)


def test_value_types_and_messages() -> None:
    res = RunResult("n1", 2, "", "no such file\n", 0.1)
    assert not res.ok and RunResult("n1", 0, "", "", 0.1).ok
    exc = NonZeroExit("n1", res)
    assert isinstance(exc, RemoteError) and exc.kind == "exit_status" and exc.result is res
    assert str(exc) == "n1: command exited with status 2: no such file"
    kinds = {c.kind for c in (remote.HostUnreachable, remote.AuthFailed, remote.HostKeyUnknown,
                              remote.HostKeyChanged, remote.RemoteTimeout, remote.NonZeroExit)}  # fmt: skip
    assert len(kinds) == 6  # one stable name per failure type (tables, JSON)
    assert remote.quote_argv(["echo", "a b", "$x"]) == "echo 'a b' '$x'"


def test_output_is_capped() -> None:
    buf = bytearray()
    remote._append(buf, b"x" * (remote.MAX_OUTPUT_BYTES + 10))
    remote._append(buf, b"y")
    assert len(buf) == remote.MAX_OUTPUT_BYTES
