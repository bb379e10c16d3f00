"""The dev cluster's own corner of the host's cgroup v1 hierarchies, so its jobs run confined like production's.

Why not Slurm's default ``/sys/fs/cgroup``: Debian's Slurm is built with multiple-slurmd, and its cgroup/v1 plugin
then puts node ``gpu001``'s jobs under ``<controller>/slurm_gpu001/uid_<uid>/job_<id>``. Eight ``slurmd -N`` of one
cluster get eight distinct dirs, but every dev cluster on a host names its nodes gpu001.. and numbers its jobs
from 1, so two clusters would share ``slurm_gpu001/uid_1001/job_3``: one cluster's job end would kill the other's
processes and reset its device limits. 22.05 has no ``CgroupPrepend`` setting (it is fixed at ``/slurm_%n``), but
it has ``CgroupMountpoint``: each cluster gets ``/sys/fs/cgroup/<controller>/nuro-dc-<hash of its state dir>``,
bind-mounted at ``<state dir>/cgroup/<controller>``, and its cgroup.conf names that mountpoint. Slurm then creates
``slurm_gpu001/...`` inside the cluster's own cgroup: same kernel controllers, same enforcement, no sharing.

One known gap of the bind mount: Slurm's ``proctrack_g_has_pid`` reads ``/proc/PID/cgroup``, which names paths from
the hierarchy's real root, so it does not match under the mountpoint. Only pam_slurm_adopt-style lookups and
``srun --network`` caller-id use it; neither runs on the dev cluster.

:func:`release` (on ``down`` and before every ``up``) kills whatever is still inside the cluster's cgroups, which can
only be its own job processes, removes the cgroup dirs bottom-up and unmounts the binds; it never touches another
cluster's dir or anything outside ``nuro-dc-<hash>``.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil

from nuro.cluster.description import Confinement

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
#: The v1 controllers Slurm's cgroup/v1 plugin may use: freezer (proctrack), memory and devices (task/cgroup),
#: cpuset (ConstrainCores) and cpuacct (jobacct_gather/cgroup). All are bound, so no plugin finds one missing.
CONTROLLERS = ("freezer", "memory", "devices", "cpuset", "cpuacct")
PREFIX = "nuro-dc-"
#: Major number of the dev cluster's stand-in GPU device files: 120 is in a range Linux reserves for local and
#: experimental use (Documentation/admin-guide/devices.txt), so no driver answers it (open gives ENXIO) and it can
#: never be a real device of the host (/dev/null is 1:3, NVIDIA's GPUs are 195:N).
FAKE_GPU_MAJOR = 120


def fake_gpu_rdev(index: int) -> int:
    """Device number of the dev cluster's ``dev/nvidia<index>``: 120:<index>, one per GPU, as real GPUs have."""
    return os.makedev(FAKE_GPU_MAJOR, index)


class CgroupError(RuntimeError):
    """The host cannot give the dev cluster its cgroups; the message says what is missing."""


def cluster_cgroup_name(state_dir: Path) -> str:
    """``nuro-dc-<12 hex of sha256(absolute state dir)>``: one per state dir, found again by ``down`` alone."""
    return PREFIX + hashlib.sha256(os.path.abspath(state_dir).encode()).hexdigest()[:12]


def mountpoint(state_dir: Path) -> Path:
    """``CgroupMountpoint`` of the cluster: ``<state dir>/cgroup`` (one bind mount per controller below it), with
    symlinks resolved: /proc/self/mountinfo names mounts by their real path, and ``release`` finds them there."""
    return Path(os.path.realpath(state_dir)) / "cgroup"


def confinement(state_dir: Path) -> Confinement:
    """The dev cluster's :class:`Confinement`: cgroup/v1 at its own mountpoint, no core binding.

    ConstrainCores and task/affinity stay off: every emulated node claims 16 CPUs on a box with 2, and binding a
    task to CPUs that do not exist fails its launch. Devices, RAM and swap are constrained as in production; swap
    only where the kernel accounts it (``memory.memsw.*``): without it task/cgroup refuses to load ("ConstrainSwapSpace
    is enabled but there is no support for swap") and no slurmd starts.
    """
    return Confinement(
        cgroup_plugin="cgroup/v1",
        cgroup_mountpoint=str(mountpoint(state_dir)),
        constrain_cores=False,
        task_affinity=False,
        constrain_swap=(CGROUP_ROOT / "memory" / "memory.memsw.limit_in_bytes").exists(),
    )


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, fs type, super options) of every mount, from /proc/self/mountinfo."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) >= 5 and len(rest) >= 3:
            out.append((fields[4].replace("\\040", " "), rest[0], rest[2]))
    return out


def _v1_controllers() -> set[str]:
    """Controllers mounted as cgroup v1 at ``/sys/fs/cgroup/<name>``."""
    found = set()
    for point, fstype, opts in _mounts():
        if fstype == "cgroup" and Path(point).parent == CGROUP_ROOT:
            found.update(o for o in opts.split(",") if o in CONTROLLERS)
    return found


def _is_mounted(path: Path) -> bool:
    return any(point == str(path) for point, _, _ in _mounts())


def _own_dirs(state_dir: Path) -> list[Path]:
    """This cluster's cgroup dir in each controller that has one."""
    name = cluster_cgroup_name(state_dir)
    return [CGROUP_ROOT / c / name for c in CONTROLLERS if (CGROUP_ROOT / c / name).is_dir()]


def prepare(state_dir: Path) -> None:
    """Create the cluster's cgroup in every controller and bind it at :func:`mountpoint` (idempotent).

    Stale state of an earlier run of this state dir (a crash without ``down``) is released first, so job ids
    that start again at 1 never land in cgroups that still hold old processes or limits.
    """
    missing = [c for c in CONTROLLERS if c not in _v1_controllers()]
    if missing:
        raise CgroupError(
            f"the dev cluster confines jobs with Slurm's cgroup/v1 plugin, but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not mounted as cgroup v1 under {CGROUP_ROOT} (see "
            "/proc/self/mountinfo); mount them (mount -t cgroup -o <controller> cgroup /sys/fs/cgroup/<controller>)"
        )
    problems = release(state_dir)
    if problems:
        raise CgroupError(f"cgroups of an earlier run of {state_dir} could not be removed: {'; '.join(problems)}")
    name = cluster_cgroup_name(state_dir)
    for c in CONTROLLERS:
        own = CGROUP_ROOT / c / name
        own.mkdir(exist_ok=True)
        if c == "cpuset":  # a new cpuset has no CPUs or memory nodes: inherit the root's, as Slurm's own do
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if not (own / knob).read_text().strip():
                    (own / knob).write_text((CGROUP_ROOT / c / knob).read_text())
        target = mountpoint(state_dir) / c
        target.mkdir(parents=True, exist_ok=True)
        if not _is_mounted(target):
            _run(["mount", "--bind", str(own), str(target)])


def _run(argv: list[str]) -> None:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if res.returncode != 0:
        raise CgroupError(f"{' '.join(argv)} failed: {res.stderr.strip() or res.returncode}")


def _procs(cg: Path) -> list[int]:
    try:
        return [int(p) for p in (cg / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _tree(root: Path) -> list[Path]:
    """Every cgroup dir at and below ``root``, deepest first (the order they can be removed in)."""
    dirs = [Path(d) for d, _, _ in os.walk(root)]
    return sorted(dirs, key=lambda d: len(d.parts), reverse=True)


def leftover_processes(state_dir: Path) -> list[int]:
    """PIDs still inside this cluster's cgroups (any controller): its job processes, never anyone else's."""
    pids: set[int] = set()
    for own in _own_dirs(state_dir):
        for cg in _tree(own):
            pids.update(_procs(cg))
    return sorted(pids)


def node_processes(state_dir: Path, node: str) -> list[psutil.Process]:
    """PIDs in node ``node``'s cgroups (``slurm_<node>``, any controller): its jobs' processes, including the ones
    that left slurmstepd's process tree (a double fork, ``setsid``), which ``kill-node`` must kill as a host
    crash would."""
    pids: set[int] = set()
    for own in _own_dirs(state_dir):
        node_dir = own / f"slurm_{node}"
        if node_dir.is_dir():
            for cg in _tree(node_dir):
                pids.update(_procs(cg))
    procs = []
    for pid in sorted(pids):
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    return procs


def throttle_dir(state_dir: Path, node: str) -> Path:
    """The cpu cgroup ``throttle_node`` puts a node's job processes in (v1 cpu controller, the cluster's own)."""
    return CGROUP_ROOT / "cpu" / cluster_cgroup_name(state_dir) / f"throttle-{node}"


def throttle_node(state_dir: Path, node: str, cpus: float) -> list[int]:
    """Limit node ``node``'s running job processes to ``cpus`` CPUs (a CFS quota): a throttled GPU's slowdown,
    for real, on the processes of that node only (their children inherit it). Returns the PIDs moved.

    Raises:
        CgroupError: no v1 cpu controller, or the cgroup cannot be made.
    """
    if not 0.01 <= cpus <= 64:
        raise ValueError(f"cpus={cpus}: give a share between 0.01 and 64")
    if not (CGROUP_ROOT / "cpu" / "cgroup.procs").exists():
        raise CgroupError("no cgroup v1 cpu controller at /sys/fs/cgroup/cpu: cannot throttle a node")
    cg = throttle_dir(state_dir, node)
    try:
        cg.mkdir(parents=True, exist_ok=True)
        (cg / "cpu.cfs_period_us").write_text("100000")
        (cg / "cpu.cfs_quota_us").write_text(str(int(cpus * 100000)))
    except OSError as exc:
        raise CgroupError(f"cannot set up {cg}: {exc.strerror}") from exc
    moved = []
    for proc in node_processes(state_dir, node):
        try:
            (cg / "cgroup.procs").write_text(str(proc.pid))
            moved.append(proc.pid)
        except OSError:  # it ended meanwhile
            continue
    return moved


def release(state_dir: Path, timeout_s: float = 10.0) -> list[str]:
    """Kill what is left inside the cluster's cgroups, remove them bottom-up and unmount the binds.

    Returns what could not be cleaned (empty when all is gone). Runs after the daemons stopped, so every process
    still inside is a job process of this cluster that outlived its slurmstepd (e.g. ``kill-node``).
    """
    problems: list[str] = []
    freezer = CGROUP_ROOT / "freezer" / cluster_cgroup_name(state_dir)
    if freezer.is_dir():  # a frozen cgroup's processes cannot die: thaw first
        for cg in _tree(freezer):
            state = cg / "freezer.state"
            try:
                if state.read_text().strip() != "THAWED":
                    state.write_text("THAWED")
            except OSError:
                continue
    deadline = time.monotonic() + timeout_s
    while pids := leftover_processes(state_dir):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        if time.monotonic() > deadline:
            problems.append(f"processes {pids} still in the cluster's cgroups after SIGKILL")
            break
        time.sleep(0.1)
    for c in CONTROLLERS:
        target = mountpoint(state_dir) / c
        if _is_mounted(target):
            try:
                _run(["umount", str(target)])
            except CgroupError as exc:
                problems.append(str(exc))
                continue
        try:
            target.rmdir()
        except FileNotFoundError:
            pass
        except OSError as exc:
            problems.append(f"{target}: {exc.strerror}")
    throttles = CGROUP_ROOT / "cpu" / cluster_cgroup_name(state_dir)  # throttle_node's (its processes died above)
    for own in [*_own_dirs(state_dir), *([throttles] if throttles.is_dir() else [])]:
        for cg in _tree(own):
            try:
                cg.rmdir()  # cgroupfs: rmdir of a dir with no tasks and no children removes it, files and all
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    problems.append(f"{cg}: {exc.strerror}")
    try:
        mountpoint(state_dir).rmdir()
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno != errno.ENOTEMPTY:
            problems.append(f"{mountpoint(state_dir)}: {exc.strerror}")
    for p in problems:
        log.warning("cgroup clean-up of %s: %s", state_dir, p)
    return problems
