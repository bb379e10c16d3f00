"""Which Slurm a dev cluster runs (``devcluster up --slurm 22.05|24.11|26.05``) and how its commands are reached.

22.05 is the host's own Debian 12 package: daemons and clients run as they always did. 24.11 and 26.05 come from a
Debian root filesystem (:mod:`nuro.devcluster.rootfs`, built once and cached). For those:

* **Daemons** (slurmdbd, slurmctld, every ``slurmd -N``) run under ``chroot`` in a per-cluster *overlay* of the
  cached root (lower: the cache, read-only; upper: ``<state>/rootfs/``), so nothing a cluster writes reaches the
  cache and two clusters never share a mount. The overlay and every bind inside it are made in the supervisor's own
  mount namespace (``unshare(CLONE_NEWNS)``, propagation private): they exist only while the supervisor or one of
  its daemons lives and vanish with the last of them, so no crash can leave a bind behind on the host.
* **What the daemons see at the host's paths**: the state dir (recursively, with its cgroup binds), the short
  socket dir (munge socket, slurmd spools), the venv and the checkout (jobs run the host's Python 3.11 and nuro),
  ``/tmp`` and ``/home`` (job output and work dirs), the host's python3.11 binary and standard library, and the
  host's ``/etc`` at ``/.host-etc`` with ``/etc/passwd``, ``group``, ``shadow`` and ``gshadow`` linked to it: users
  made after ``up`` (useradd replaces those files) are seen at once, which a bind of the file itself would not do.
  ``shadow`` too: 26.05's slurmd loads the user's login environment for ``--export=ALL,VAR=value`` through
  ``su - <user>``, whose PAM account check fails ("user env retrieval failed requeued held") for a user the root's
  own shadow file does not list.
* **Munge and MariaDB are the host's**: the wire protocols are stable (munge 0.5.15 answers 0.5.16/0.5.18 clients),
  so only Slurm itself comes from the root.
* **Clients** (``squeue``, ``sbatch``, ``sacctmgr`` ... for root, team users, tests, nuro's own adapter) run on the
  host, no chroot: ``<state>/bin/<cmd>`` is a two-line script that runs the root's binary through the root's own
  dynamic loader (``ld-linux --argv0 <cmd> --library-path <root's libs>``). ``devcluster env`` puts that directory
  first on ``PATH``. ``PluginDir`` names the root's plugin directory by its cache path, valid inside the chroot too
  (the root links its own cache path to ``/``), so the same wrapper also works inside a job.

Measured (docs/slurm-versions.md): a wrapped ``squeue --json`` costs 13-20 ms, like the host's own.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nuro.devcluster import rootfs

log = logging.getLogger(__name__)

HOST_VERSION = "22.05"
#: Every version ``devcluster up --slurm`` takes: the host's, then the ones with a root filesystem recipe.
SUPPORTED = (HOST_VERSION, *rootfs.VERSIONS)

#: The client commands wrapped in ``<state>/bin`` (those of them the root has).
CLIENT_COMMANDS = (
    "sacct", "sacctmgr", "salloc", "sattach", "sbatch", "sbcast", "scancel", "scontrol", "scrontab", "sdiag",
    "sinfo", "sprio", "squeue", "sreport", "srun", "sshare", "sstat", "strigger",
)  # fmt: skip
LIB_DIRS = ("usr/lib/x86_64-linux-gnu/slurm-wlm", "usr/lib/x86_64-linux-gnu")
LOADER = "lib64/ld-linux-x86-64.so.2"
PLUGIN_DIR = "usr/lib/x86_64-linux-gnu/slurm-wlm"
#: Where the host's /etc is seen inside the root (``/etc/passwd`` and ``/etc/group`` link into it).
HOST_ETC = "/.host-etc"
LINKED_ETC = ("passwd", "group", "shadow", "gshadow")
#: The host's Python under a job's venv (its ``pyvenv.cfg`` home is /usr/bin).
HOST_PYTHON = ("/usr/bin/python3.11", "/usr/lib/python3.11")

CLONE_NEWNS = 0x00020000


SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def path_with(bin_dir: Path, path: str) -> str:
    """``path`` with the client wrappers' dir first (once): how every host-side caller finds this cluster's Slurm."""
    rest = [p for p in path.split(":") if p and p != str(bin_dir)]
    return ":".join([str(bin_dir), *rest])


class SlurmRootError(RuntimeError):
    """The requested version cannot run here; the message says what to do."""


def check_version(version: str) -> str:
    """``version`` if ``up --slurm`` supports it, else a refusal naming the supported ones."""
    if version not in SUPPORTED:
        raise SlurmRootError(
            f"Slurm {version!r} is not supported by the dev cluster; choose one of {', '.join(SUPPORTED)} "
            f"({HOST_VERSION} is the host's Debian package, the others run from a cached Debian root filesystem)"
        )
    return version


@dataclass(frozen=True)
class SlurmInstall:
    """One dev cluster's Slurm: the host's (``rootfs`` None) or a cached root filesystem's."""

    version: str
    rootfs: Path | None = None

    @property
    def chrooted(self) -> bool:
        return self.rootfs is not None

    def plugin_dir(self) -> str | None:
        """slurm.conf's ``PluginDir``: the root's plugin dir by its cache path (None: Slurm's built-in default)."""
        return str(self.rootfs / PLUGIN_DIR) if self.rootfs else None

    def client_argv(self, command: str) -> list[str]:
        """How the host runs ``command`` of this Slurm (no chroot, any user)."""
        if self.rootfs is None:
            return [command]
        libs = ":".join(str(self.rootfs / d) for d in LIB_DIRS)
        binary = self.rootfs / "usr/bin" / command
        return [str(self.rootfs / LOADER), "--argv0", command, "--library-path", libs, str(binary)]

    def wrapper_script(self, command: str, slurm_conf: Path) -> str:
        """``<state>/bin/<command>``: the root's client with this cluster's slurm.conf unless one is set."""
        argv = " ".join(shlex.quote(a) for a in self.client_argv(command))
        conf = shlex.quote(str(slurm_conf))
        return f'#!/bin/sh\n[ -n "${{SLURM_CONF:-}}" ] || SLURM_CONF={conf}\nexport SLURM_CONF\nexec {argv} "$@"\n'

    def clients(self) -> list[str]:
        """The wrapped commands this root has."""
        if self.rootfs is None:
            return []
        return [c for c in CLIENT_COMMANDS if (self.rootfs / "usr/bin" / c).exists()]


def resolve(version: str, build: bool = True) -> SlurmInstall:
    """The install of ``version``: the host's for 22.05, else the cached root filesystem (built if ``build``)."""
    check_version(version)
    if version == HOST_VERSION:
        return SlurmInstall(version)
    path = rootfs.ensure_rootfs(version) if build else rootfs.cache_dir(version)
    return SlurmInstall(version, path)


def write_wrappers(install: SlurmInstall, bin_dir: Path, slurm_conf: Path) -> list[Path]:
    """(Re)write ``bin_dir`` with one wrapper per client; an empty dir for the host's Slurm. Mode 755 (users run
    them); the old wrappers go first, so a cluster switched back to 22.05 leaves none behind on ``PATH``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    bin_dir.chmod(0o755)
    for old in bin_dir.iterdir():
        old.unlink()
    written = []
    for command in install.clients():
        path = bin_dir / command
        path.write_text(install.wrapper_script(command, slurm_conf))
        path.chmod(0o755)
        written.append(path)
    return written


# ---------------------------------------------------------------------------------------------------------------
# The per-cluster root: overlay + binds, in the supervisor's private mount namespace


@dataclass(frozen=True)
class RootPlan:
    """Where one cluster's overlay lives and what is bound into it (all host paths, seen at the same path)."""

    lower: Path  # the cached root filesystem
    upper: Path  # <state>/rootfs/upper
    work: Path  # <state>/rootfs/work (overlayfs' scratch dir, same filesystem as upper)
    merged: Path  # <sockets>/root: where the daemons chroot
    recursive: tuple[str, ...]  # the state dir: read-write with what is mounted below it (its cgroup binds)
    writable: tuple[str, ...]  # sockets dir, /tmp, /home: read-write, not recursive (the sockets dir holds merged)
    readonly: tuple[str, ...]  # venv, checkout, host python

    def binds(self) -> list[rootfs.Bind]:
        """Every host path of the plan as a :class:`rootfs.Bind` (same path inside the root)."""
        return (
            [rootfs.Bind(p, writable=True, recursive=True) for p in self.recursive]
            + [rootfs.Bind(p, writable=True) for p in self.writable]
            + [rootfs.Bind(p) for p in self.readonly]
        )


def plan_root(
    install: SlurmInstall, state_dir: Path, sockets: Path, venv: Path, checkout: Path, extra: Sequence[str] = ()
) -> RootPlan:
    if install.rootfs is None:
        raise SlurmRootError(f"Slurm {install.version} runs from the host; it has no root to plan")
    writable = [str(sockets), "/tmp", *(p for p in ("/home",) if Path(p).is_dir()), *extra]
    readonly: list[str] = []
    for path in (str(venv), str(checkout), *HOST_PYTHON):
        if not _below_any(path, [str(state_dir), *writable, *readonly]):
            readonly = [p for p in readonly if not _below_any(p, [path])] + [path]
    return RootPlan(
        lower=install.rootfs,
        upper=state_dir / "rootfs" / "upper",
        work=state_dir / "rootfs" / "work",
        merged=sockets / "root",
        recursive=(str(state_dir),),
        writable=tuple(dict.fromkeys(writable)),
        readonly=tuple(readonly),
    )


def _below_any(path: str, parents: Sequence[str]) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in parents)


def mount_argvs(plan: RootPlan) -> list[list[str]]:
    """The mounts of :func:`enter_root`, in order (data: the unit tests pin them): the overlay, then the root
    filesystem's usual set inside it (:func:`rootfs.mount_argvs`), then the host's /etc read-only at HOST_ETC."""
    m = str(plan.merged)
    layers = f"lowerdir={plan.lower},upperdir={plan.upper},workdir={plan.work}"
    return [
        ["mount", "-t", "overlay", "overlay", "-o", layers, m],
        *rootfs.mount_argvs(plan.merged, plan.binds()),
        ["mount", "--bind", "/etc", f"{m}{HOST_ETC}"],
        ["mount", "-o", "remount,bind,ro", f"{m}{HOST_ETC}"],
    ]


def private_mount_namespace() -> None:
    """Move this process into its own mount namespace, propagation private: mounts made from now on (and by our
    children) are invisible to the host and disappear when the last process in the namespace exits."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise SlurmRootError(f"unshare(CLONE_NEWNS) failed: {os.strerror(err)} (needs root)")
    rootfs.run(["mount", "--make-rprivate", "/"], "private mount namespace", timeout_s=30)


def _prepare_upper(plan: RootPlan) -> None:
    """The /etc links, made in the upper layer before the overlay is mounted (the cache is never written):
    ``/etc/passwd`` -> ``/.host-etc/passwd`` and the same for each of :data:`LINKED_ETC`."""
    for d in (plan.upper, plan.work, plan.merged):
        d.mkdir(parents=True, exist_ok=True)
    etc = plan.upper / "etc"
    etc.mkdir(exist_ok=True)
    for name in LINKED_ETC:
        link = etc / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(f"{HOST_ETC}/{name}")


def enter_root(plan: RootPlan) -> None:
    """Private mount namespace, then the overlay and its binds (:func:`mount_argvs`). Call once, in the supervisor,
    before the first daemon starts: every child inherits the namespace."""
    for bind in plan.binds():
        if not Path(bind.path).exists():
            raise SlurmRootError(f"{bind.path} (bound into the Slurm root) does not exist on the host")
    _prepare_upper(plan)
    private_mount_namespace()
    rootfs.run_mounts(plan.merged, mount_argvs(plan))


def daemon_argv(plan: RootPlan | None, argv: list[str]) -> list[str]:
    """``argv`` as the host runs it, or under ``chroot`` in the cluster's root (chroot execs: same PID)."""
    return argv if plan is None else ["chroot", str(plan.merged), *argv]
