"""Run a command on, or fetch files from, one host over SSH (paramiko), with typed per-host errors.

Why a thin adapter: ``nuro-admin nodes`` fans out to many hosts and must tell an admin, per host, *what kind* of
failure happened (the fix differs: a dead node, a missing key, a reinstalled node with a new host key, a hung
command), and every remote call takes an explicit timeout so one bad node cannot stall a fan-out.

Host-key checking is ON by default: keys are checked against the host's ``known_hosts`` file only (never
``~/.ssh``), and an unknown key is refused (paramiko's ``RejectPolicy`` semantics), a changed key is refused with
``HostKeyChanged``. ``check_host_key=False`` exists for first contact only and says so in the log.

Error table (what paramiko/socket raises -> what we raise):

=========================================================  =================
connection refused / no route / connect timed out / DNS     ``HostUnreachable``
``AuthenticationException``                                  ``AuthFailed``
key not in known_hosts                                       ``HostKeyUnknown``
``BadHostKeyException`` (key differs from known_hosts)       ``HostKeyChanged``
connect + command not done within ``timeout_s``              ``RemoteTimeout``
exit status != 0 (only with ``check=True``)                  ``NonZeroExit``
anything else from the SSH layer                             ``RemoteError``
=========================================================  =================
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import stat
import time
from dataclasses import dataclass
from pathlib import Path

import paramiko

log = logging.getLogger(__name__)

#: Cap on captured stdout/stderr per host (bytes): a fan-out of ``cat``-ing a big file must not eat the memory.
MAX_OUTPUT_BYTES = 1 << 20


@dataclass(frozen=True)
class Host:
    """One SSH target. ``known_hosts`` is the file its host key is checked against (None: host-key check off)."""

    name: str
    address: str
    port: int = 22
    user: str = "root"
    key_file: Path | None = None
    known_hosts: Path | None = None


@dataclass(frozen=True)
class RunResult:
    """A command that ran to completion on ``host`` (any exit status)."""

    host: str
    exit_status: int
    stdout: str
    stderr: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


class RemoteError(Exception):
    """An SSH operation on ``host`` failed; ``kind`` is a short stable name for tables and JSON."""

    kind = "error"

    def __init__(self, host: str, message: str) -> None:
        super().__init__(f"{host}: {message}")
        self.host = host
        self.message = message


class HostUnreachable(RemoteError):
    kind = "unreachable"


class AuthFailed(RemoteError):
    kind = "auth_failed"


class HostKeyUnknown(RemoteError):
    kind = "host_key_unknown"


class HostKeyChanged(RemoteError):
    kind = "host_key_changed"


class RemoteTimeout(RemoteError):
    kind = "timeout"


class NonZeroExit(RemoteError):
    kind = "exit_status"

    def __init__(self, host: str, result: RunResult) -> None:
        super().__init__(host, f"command exited with status {result.exit_status}: {result.stderr.strip()[-300:]}")
        self.result = result


class _RejectUnknown(paramiko.MissingHostKeyPolicy):
    """paramiko's ``RejectPolicy``, raising our typed error with the fix in the message."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise HostKeyUnknown(
            self.host.name,
            f"host key for {hostname} ({key.get_name()} {key.get_fingerprint().hex()}) is not in "
            f"{self.host.known_hosts}; verify it and add it (ssh-keyscan -p {self.host.port} {self.host.address})",
        )


def _connect(host: Host, timeout_s: float, check_host_key: bool) -> paramiko.SSHClient:
    """An authenticated client, or a typed error. ``timeout_s`` bounds TCP connect, banner and auth each."""
    client = paramiko.SSHClient()
    if check_host_key:
        if host.known_hosts is not None and Path(host.known_hosts).exists():
            client.load_host_keys(str(host.known_hosts))
        client.set_missing_host_key_policy(_RejectUnknown(host))
    else:
        log.warning("host=%s host-key check OFF (first contact only)", host.name)
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    try:
        client.connect(
            host.address,
            port=host.port,
            username=host.user,
            key_filename=str(host.key_file) if host.key_file else None,
            timeout=timeout_s,
            banner_timeout=timeout_s,
            auth_timeout=timeout_s,
            allow_agent=False,
            look_for_keys=host.key_file is None,
        )
    except RemoteError:
        client.close()
        raise
    except paramiko.BadHostKeyException as exc:
        client.close()
        raise HostKeyChanged(
            host.name,
            f"host key changed: {host.address} offered {exc.key.get_name()} {exc.key.get_fingerprint().hex()}, "
            f"{host.known_hosts} has {exc.expected_key.get_fingerprint().hex()}. Refused: if the node was "
            f"reinstalled, remove its old line (ssh-keygen -R {host.address} -f {host.known_hosts}) and re-add it",
        ) from None
    except paramiko.AuthenticationException as exc:
        client.close()
        raise AuthFailed(host.name, f"authentication as {host.user} with {host.key_file} failed: {exc}") from None
    except TimeoutError as exc:
        client.close()
        raise HostUnreachable(
            host.name, f"no answer from {host.address}:{host.port} in {timeout_s:g} s ({exc})"
        ) from None
    except paramiko.ssh_exception.NoValidConnectionsError as exc:
        client.close()
        # paramiko wraps the per-address socket errors; name the real one ("Connection refused", "No route…").
        why = "; ".join(sorted({(e.strerror or str(e)) for e in exc.errors.values()})) or str(exc)
        raise HostUnreachable(host.name, f"cannot connect to {host.address}:{host.port}: {why}") from None
    except OSError as exc:  # socket.gaierror included (an unknown name)
        client.close()
        raise HostUnreachable(host.name, f"cannot connect to {host.address}:{host.port}: {exc}") from None
    except paramiko.SSHException as exc:
        client.close()
        # A banner/auth timeout surfaces as a plain SSHException ("Error reading SSH protocol banner").
        raise HostUnreachable(host.name, f"SSH handshake with {host.address}:{host.port} failed: {exc}") from None
    return client


def run(
    host: Host,
    command: str,
    timeout_s: float = 30.0,
    check: bool = False,
    check_host_key: bool = True,
) -> RunResult:
    """Run ``command`` (a line for the remote user's shell, like ``ssh host CMD``) on ``host``.

    ``timeout_s`` is the per-host budget for connect + command: past it the channel is closed and
    ``RemoteTimeout`` is raised (the remote process gets SIGHUP only if it writes; sshd closes its pipes).

    Raises:
        RemoteError: one of the typed subclasses in the module table.
    """
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    log.debug("host=%s run %r timeout_s=%g", host.name, command, timeout_s)
    client = _connect(host, min(timeout_s, 15.0), check_host_key)
    try:
        chan = client.get_transport().open_session(timeout=max(0.1, deadline - time.monotonic()))
        chan.exec_command(command)
        chan.shutdown_write()
        out, err = bytearray(), bytearray()
        chan.settimeout(0.1)
        while True:
            while chan.recv_ready():
                _append(out, chan.recv(65536))
            while chan.recv_stderr_ready():
                _append(err, chan.recv_stderr(65536))
            if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                break
            if time.monotonic() >= deadline:
                raise RemoteTimeout(host.name, f"command did not finish in {timeout_s:g} s: {command!r}")
            with contextlib.suppress(TimeoutError):  # waits up to 0.1 s for output: the loop's tick
                _append(out, chan.recv(65536))
        result = RunResult(
            host=host.name,
            exit_status=chan.recv_exit_status(),
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            duration_s=time.monotonic() - t0,
        )
    except RemoteError:
        raise
    except (paramiko.SSHException, OSError) as exc:
        raise RemoteError(host.name, f"SSH session failed: {exc}") from None
    finally:
        client.close()
    if check and not result.ok:
        raise NonZeroExit(host.name, result)
    return result


def _append(buf: bytearray, data: bytes) -> None:
    if len(buf) < MAX_OUTPUT_BYTES:
        buf.extend(data[: MAX_OUTPUT_BYTES - len(buf)])


def quote_argv(argv: list[str]) -> str:
    """A shell line that runs ``argv`` exactly (for callers with an argv rather than a shell line)."""
    return shlex.join(argv)


@dataclass(frozen=True)
class Fetched:
    """One file fetched over SFTP: where it came from, where it went, its size (or why it was skipped)."""

    remote: str
    local: Path | None
    size_bytes: int
    error: str | None = None


def fetch(
    host: Host,
    files: dict[str, Path],
    timeout_s: float = 60.0,
    check_host_key: bool = True,
) -> list[Fetched]:
    """Fetch each ``remote path -> local path`` over SFTP on one connection.

    A missing remote file is recorded (``error``) rather than raised: collecting logs should bring back what
    exists. Connection-level failures raise the typed errors of ``run``.
    """
    t0 = time.monotonic()
    client = _connect(host, min(timeout_s, 15.0), check_host_key)
    out: list[Fetched] = []
    try:
        sftp = client.open_sftp()
        sftp.get_channel().settimeout(timeout_s)
        for remote, local in files.items():
            if time.monotonic() - t0 > timeout_s:
                raise RemoteTimeout(host.name, f"fetching {len(files)} files took over {timeout_s:g} s")
            try:
                st = sftp.stat(remote)
                if not stat.S_ISREG(st.st_mode or 0):
                    out.append(Fetched(remote, None, 0, "not a regular file"))
                    continue
                local.parent.mkdir(parents=True, exist_ok=True)
                sftp.get(remote, str(local))
                out.append(Fetched(remote, local, local.stat().st_size))
            except FileNotFoundError:
                out.append(Fetched(remote, None, 0, "no such file"))
            except PermissionError as exc:
                out.append(Fetched(remote, None, 0, f"permission denied: {exc}"))
    except RemoteError:
        raise
    except TimeoutError:
        raise RemoteTimeout(host.name, f"SFTP transfer stalled for {timeout_s:g} s") from None
    except (paramiko.SSHException, OSError) as exc:
        raise RemoteError(host.name, f"SFTP failed: {exc}") from None
    finally:
        client.close()
    return out
