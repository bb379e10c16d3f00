"""SSH test hosts on one machine: each "host" is a network namespace with a veth pair and its own sshd.

Why namespaces: ``nuro-admin nodes`` and the Ansible roles must be tested against real sshd servers at distinct
addresses (host keys, refused connections, dead hosts), and the dev cluster's nodes all live on this machine.
Namespaces share the filesystem, so a host reached over SSH sees the same files as the dev cluster.

Layout of one session (``SSHHosts(...).up(n, state_dir)``)::

    route  unreachable 10.231.X.0/24           added FIRST: the session's claim on the /24 (``ip route add`` fails
                                               with "File exists" when another session holds it) and a guard so
                                               nothing in the range leaks to the default gateway before a veth exists
    host i netns  nuro-t-<id>-<i>
           veth   nt<id><i>h (root ns, 10.231.X.4i+1/30)  <->  nt<id><i>n (in the netns, 10.231.X.4i+2/30)
           sshd   /usr/sbin/sshd -D -f <state_dir>/<name>/sshd_config, listening on 10.231.X.4i+2:22 only
    client key    <state_dir>/client_ed25519 (authorized on every host), known_hosts <state_dir>/known_hosts

Everything created is written to ``<state_dir>/sshhosts.json`` before it is created, so ``down()`` (or
``SSHHosts.load(state_dir).down()`` from another process after a crash) removes exactly what this session made:
sshd by PID (with its start time, ``nuro.devcluster.procs``), namespaces and veths by name, the route by prefix.
Nothing is ever matched by pattern.

Example::

    hosts = SSHHosts()
    for h in hosts.up(4, tmp_path):
        print(h.name, h.address)
    write_inventory(tmp_path / "inventory.yml", hosts.hosts, groups={"gpu": ["nuro-t-ab12cd-0"]})
    hosts.down()
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from nuro.devcluster.install import ensure_packages
from nuro.devcluster.procs import ProcRef, stop_processes
from nuro.remote import Host

__all__ = ["Host", "SSHHosts", "SSHHostsError", "ensure_sshd", "write_inventory"]

log = logging.getLogger(__name__)

SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = "/usr/bin/ssh-keygen"
#: The test range: one /24 per session, picked from 10.231.0.0/16 (256 sessions, 63 hosts each).
TEST_RANGE_PREFIX = "10.231"
MAX_HOSTS = 63
SSH_PORT = 22
SYSTEM_PYTHON = "/usr/bin/python3"
NS_PREFIX = "nuro-t-"
STATE_FILE = "sshhosts.json"
SSHD_READY_TIMEOUT_S = 10.0


class SSHHostsError(RuntimeError):
    """Setting up or tearing down SSH test hosts failed; the message names the step and the argv."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    argv = ["ip", *args]
    log.debug("running %s", argv)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if check and proc.returncode != 0:
        raise SSHHostsError(f"{' '.join(argv)} failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc


def ensure_sshd(timeout_s: float = 900.0) -> None:
    """Install openssh-server when ``/usr/sbin/sshd`` is missing (root, apt); never enable the system service.

    Debian's postinst tries to start ssh.service; without systemd ``invoke-rc.d`` only prints that it was denied.
    """
    if Path(SSHD).exists() and Path(SSH_KEYGEN).exists():
        return
    ensure_packages(timeout_s, packages={"openssh-server": SSHD, "openssh-client": SSH_KEYGEN})


def _keygen(path: Path, comment: str) -> None:
    """A fresh ed25519 key pair at ``path`` / ``path.pub`` (replacing any earlier pair)."""
    for p in (path, path.with_name(path.name + ".pub")):
        p.unlink(missing_ok=True)
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
        timeout=30,
    )


def _pub(path: Path) -> str:
    """``<type> <base64>`` of a key pair's public half (comment dropped)."""
    return " ".join(path.with_name(path.name + ".pub").read_text().split()[:2])


@dataclass
class _HostState:
    """What one host consists of: enough to remove it from another process."""

    host: Host
    netns: str
    veth_root: str
    veth_ns: str
    root_address: str
    sshd: dict | None = None  # ProcRef.to_json()


@dataclass
class SSHHosts:
    """N SSH hosts as network namespaces; see the module docstring for the layout.

    Args:
        session_id: 6 hex chars naming the namespaces (``nuro-t-<id>-<i>``); random by default so parallel
            sessions do not collide.
        subnet: the third octet of ``10.231.X.0/24``; by default the first free one from a random start.
    """

    session_id: str = field(default_factory=lambda: secrets.token_hex(3))
    subnet: int | None = None
    state_dir: Path | None = None
    _hosts: list[_HostState] = field(default_factory=list)
    _route: str | None = None

    # ---- public API -------------------------------------------------------------------------------------------

    @property
    def hosts(self) -> list[Host]:
        return [h.host for h in self._hosts]

    def host(self, name: str) -> Host:
        return self._state(name).host

    @property
    def client_key(self) -> Path:
        return self._dir / "client_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self._dir / "known_hosts"

    def up(self, n: int, state_dir: Path) -> list[Host]:
        """Create ``n`` hosts under ``state_dir`` and wait until each sshd answers; returns them in order.

        Raises:
            SSHHostsError: a step failed (everything created so far is removed again before raising).
        """
        if not 1 <= n <= MAX_HOSTS:
            raise SSHHostsError(f"n must be 1..{MAX_HOSTS}, got {n}")
        if os.geteuid() != 0:
            raise SSHHostsError("SSH test hosts need root (ip netns, veth, sshd); run as root")
        ensure_sshd()
        self.state_dir = Path(state_dir).absolute()
        self._dir.mkdir(parents=True, exist_ok=True)
        self._dir.chmod(0o700)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir (Debian)
        t0 = time.monotonic()
        try:
            self._claim_subnet()
            _keygen(self.client_key, f"nuro-sshhosts-{self.session_id}")
            self.known_hosts.write_text("")
            for i in range(n):
                self._add_host(i)
            self._save()
            for st in self._hosts:
                self._start_sshd(st)
            self._save()
            self._wait_ready([st.host for st in self._hosts])
        except BaseException:
            self.down()
            raise
        log.info("sshhosts up n=%d subnet=%s duration_s=%.2f", n, self._route, time.monotonic() - t0)
        return self.hosts

    @classmethod
    @contextlib.contextmanager
    def running(cls, n: int, state_dir: Path) -> Iterator[SSHHosts]:
        """``n`` hosts for a ``with`` block, torn down (``down``) however the block or the start-up ends."""
        hosts = cls()
        try:
            hosts.up(n, state_dir)
            yield hosts
        finally:
            hosts.down()

    def down(self) -> None:
        """Stop every sshd by PID, delete the namespaces, veths and the route this session created. Idempotent."""
        procs = []
        for st in self._hosts:
            if st.sshd and (p := ProcRef.from_json(st.sshd).process()) is not None:
                procs.append(p)
        stop_processes(procs, term_timeout_s=5, what="sshd")
        existing_ns = set(_ip("netns", "list", check=False).stdout.split())
        for st in self._hosts:
            st.sshd = None
            if st.netns in existing_ns:
                _ip("netns", "del", st.netns, check=False)
            if _ip("link", "show", st.veth_root, check=False).returncode == 0:
                _ip("link", "del", st.veth_root, check=False)
        if self._route:
            _ip("route", "del", "unreachable", self._route, check=False)
            self._route = None
        self._hosts = []
        if self.state_dir is not None and (self._dir / STATE_FILE).exists():
            (self._dir / STATE_FILE).unlink()

    @classmethod
    def load(cls, state_dir: Path) -> SSHHosts:
        """The session recorded in ``state_dir`` (to call ``down()`` from another process)."""
        data = json.loads((Path(state_dir).absolute() / "sshhosts" / STATE_FILE).read_text())
        obj = cls(session_id=data["session_id"], subnet=data["subnet"], state_dir=Path(state_dir).absolute())
        obj._route = data["route"]
        for h in data["hosts"]:
            host = Host(**{k: (Path(v) if k in ("key_file", "known_hosts") else v) for k, v in h["host"].items()})
            obj._hosts.append(_HostState(**{**h, "host": host}))
        return obj

    def stop_sshd(self, name: str) -> None:
        """Stop one host's sshd (by PID): the host becomes a dead host (connection refused at its address)."""
        st = self._state(name)
        if st.sshd and (p := ProcRef.from_json(st.sshd).process()) is not None:
            stop_processes([p], term_timeout_s=5, what="sshd")
        st.sshd = None
        self._save()

    def start_sshd(self, name: str) -> None:
        """(Re)start one host's sshd and wait until it answers."""
        st = self._state(name)
        if st.sshd and ProcRef.from_json(st.sshd).is_alive():
            return
        self._start_sshd(st)
        self._save()
        self._wait_ready([st.host])

    def regenerate_host_key(self, name: str) -> None:
        """Give one host a new host key and restart its sshd, leaving known_hosts stale ("host key changed")."""
        self.stop_sshd(name)
        _keygen(self._host_dir(name) / "ssh_host_ed25519_key", name)
        self.start_sshd(name)

    # ---- steps ------------------------------------------------------------------------------------------------

    @property
    def _dir(self) -> Path:
        if self.state_dir is None:
            raise SSHHostsError("no state dir: call up(n, state_dir) first")
        return self.state_dir / "sshhosts"

    def _host_dir(self, name: str) -> Path:
        return self._dir / name

    def _state(self, name: str) -> _HostState:
        for st in self._hosts:
            if st.host.name == name:
                return st
        raise KeyError(f"no SSH test host {name!r}; hosts: {[s.host.name for s in self._hosts]}")

    def _claim_subnet(self) -> None:
        """Add ``unreachable 10.231.X.0/24`` for a free X; the add itself is the atomic claim between sessions."""
        if self.subnet is not None:
            candidates = [self.subnet]
        else:
            start = secrets.randbelow(256)
            candidates = [(start + k) % 256 for k in range(256)]
        for x in candidates:
            prefix = f"{TEST_RANGE_PREFIX}.{x}.0/24"
            # A clash shows as "File exists" (another session's route) or an address already in that /24.
            if f" {TEST_RANGE_PREFIX}.{x}." in _ip("-o", "addr", "show", check=False).stdout:
                continue
            proc = _ip("route", "add", "unreachable", prefix, check=False)
            if proc.returncode == 0:
                self.subnet, self._route = x, prefix
                self._save()
                return
            if self.subnet is not None and len(candidates) == 1:
                raise SSHHostsError(f"ip route add unreachable {prefix} failed: {proc.stderr.strip()}")
        raise SSHHostsError(f"no free /24 in {TEST_RANGE_PREFIX}.0.0/16 (all 256 claimed by unreachable routes)")

    def _add_host(self, i: int) -> None:
        name = f"{NS_PREFIX}{self.session_id}-{i}"
        base = 4 * i
        st = _HostState(
            host=Host(
                name=name,
                address=f"{TEST_RANGE_PREFIX}.{self.subnet}.{base + 2}",
                port=SSH_PORT,
                user="root",
                key_file=self.client_key,
                known_hosts=self.known_hosts,
            ),
            netns=name,
            veth_root=f"nt{self.session_id}{i}h",  # ≤ 15 chars (IFNAMSIZ)
            veth_ns=f"nt{self.session_id}{i}n",
            root_address=f"{TEST_RANGE_PREFIX}.{self.subnet}.{base + 1}",
        )
        self._hosts.append(st)
        self._save()  # recorded before creation, so down() after a crash half-way still removes it
        _ip("netns", "add", st.netns)
        _ip("link", "add", st.veth_root, "type", "veth", "peer", "name", st.veth_ns)
        _ip("link", "set", st.veth_ns, "netns", st.netns)
        _ip("addr", "add", f"{st.root_address}/30", "dev", st.veth_root)
        _ip("link", "set", st.veth_root, "up")
        _ip("-n", st.netns, "addr", "add", f"{st.host.address}/30", "dev", st.veth_ns)
        _ip("-n", st.netns, "link", "set", st.veth_ns, "up")
        _ip("-n", st.netns, "link", "set", "lo", "up")
        hdir = self._host_dir(name)
        hdir.mkdir(mode=0o700, exist_ok=True)
        _keygen(hdir / "ssh_host_ed25519_key", name)
        (hdir / "authorized_keys").write_text(_pub(self.client_key) + "\n")
        (hdir / "home").mkdir(mode=0o700, exist_ok=True)
        (hdir / "sshd_config").write_text(self._sshd_config(st))
        with self.known_hosts.open("a") as f:
            f.write(f"{st.host.address} {_pub(hdir / 'ssh_host_ed25519_key')}\n")

    def _sshd_config(self, st: _HostState) -> str:
        hdir = self._host_dir(st.host.name)
        # StrictModes no: the state dir usually sits under /tmp (mode 1777), which sshd's path check refuses.
        # UsePAM no: no PAM stack is configured for these throwaway servers; key auth only.
        # SetEnv HOME: each host has its own (empty) root home, as a separate machine would. sshd runs every command
        # through root's login shell, and bash started by sshd sources ~/.bashrc: with the real /root that is this
        # machine's own (a pyenv init there cost ~0.14 s CPU per command, ~30 % of an Ansible module's round trip).
        return (
            f"ListenAddress {st.host.address}:{st.host.port}\n"
            f"HostKey {hdir / 'ssh_host_ed25519_key'}\n"
            f"PidFile {hdir / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {hdir / 'authorized_keys'}\n"
            "PermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
            "StrictModes no\n"
            "UseDNS no\n"
            "PrintMotd no\n"
            "MaxStartups 64:30:128\n"
            "MaxSessions 64\n"
            "LogLevel INFO\n"
            "Subsystem sftp internal-sftp\n"
            f"SetEnv HOME={hdir / 'home'}\n"
        )

    def _start_sshd(self, st: _HostState) -> None:
        hdir = self._host_dir(st.host.name)
        argv = [
            "ip", "netns", "exec", st.netns,
            SSHD, "-D", "-f", str(hdir / "sshd_config"), "-E", str(hdir / "sshd.log"),
        ]  # fmt: skip
        log.debug("running %s", argv)
        # ``ip netns exec`` execs the command, so the PID we get is sshd's own.
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        st.sshd = ProcRef.of(f"sshd {st.host.name}", proc.pid).to_json()

    def _wait_ready(self, hosts: list[Host]) -> None:
        """Wait until each sshd sends its banner (a TCP accept alone can precede sshd's ready state)."""
        deadline = time.monotonic() + SSHD_READY_TIMEOUT_S
        pending = list(hosts)
        while pending:
            host = pending[0]
            st = self._state(host.name)
            ref = ProcRef.from_json(st.sshd) if st.sshd else None
            if ref is None or not ref.is_alive():
                tail = _tail(self._host_dir(host.name) / "sshd.log")
                raise SSHHostsError(f"sshd of {host.name} exited at start-up; its log ends:\n{tail}")
            try:
                with socket.create_connection((host.address, host.port), timeout=1) as s:
                    s.settimeout(2)
                    if s.recv(64).startswith(b"SSH-"):
                        pending.pop(0)
                        continue
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SSHHostsError(
                    f"sshd of {host.name} did not answer at {host.address}:{host.port} in {SSHD_READY_TIMEOUT_S} s"
                )
            time.sleep(0.02)

    def _save(self) -> None:
        data = {
            "session_id": self.session_id,
            "subnet": self.subnet,
            "route": self._route,
            "hosts": [
                {
                    **asdict(st),
                    "host": {**asdict(st.host), "key_file": str(st.host.key_file),
                             "known_hosts": str(st.host.known_hosts)},
                }
                for st in self._hosts
            ],
        }  # fmt: skip
        tmp = self._dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, self._dir / STATE_FILE)


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def write_inventory(
    path: Path,
    hosts: list[Host],
    groups: dict[str, list[str]] | None = None,
    host_vars: dict[str, dict[str, str]] | None = None,
) -> Path:
    """Write an Ansible YAML inventory for ``hosts`` (all under ``all``, plus ``groups``: group -> host names).

    Host-key checking stays on: each host carries ``-o UserKnownHostsFile=<known_hosts> -o
    StrictHostKeyChecking=yes``. ``nuro-admin nodes --inventory`` reads the same file.
    """
    groups = groups or {}
    by_name = {h.name: h for h in hosts}
    unknown = sorted({n for names in groups.values() for n in names} - set(by_name))
    if unknown:
        raise ValueError(f"groups name hosts not in the list: {unknown}")

    def hv(h: Host) -> dict[str, object]:
        return {
            "ansible_host": h.address,
            "ansible_port": h.port,
            "ansible_user": h.user,
            "ansible_ssh_private_key_file": str(h.key_file),
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={h.known_hosts} -o StrictHostKeyChecking=yes",
            # The system Python: interpreter discovery would otherwise find root's pyenv shim, which fails.
            "ansible_python_interpreter": SYSTEM_PYTHON,
            **(host_vars or {}).get(h.name, {}),
        }

    inv = {
        "all": {
            "hosts": {h.name: hv(h) for h in hosts},
            "children": {g: {"hosts": {n: None for n in names}} for g, names in groups.items()},
        }
    }
    if not groups:
        del inv["all"]["children"]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path
