"""Debian root filesystems holding a newer Slurm (24.11 from trixie, 26.05 from sid), built once and cached.

Why: this host runs Debian 12, whose Slurm is 22.05.8; nuro must also read what 24.11 and 26.05 print (their JSON
shapes differ: tests/fixtures/slurm/v24.11, v26.05). Debian's registry serves trixie and sid, so a ``debootstrap``
root filesystem of either, with Slurm installed inside, runs real newer daemons under ``chroot`` on this very host.
A build takes 1-1.5 minutes and ~700 MB, so it is cached outside any checkout, under
``/var/cache/nuro/rootfs/<suite>-<hash>``, where the hash covers the package list and :data:`BUILD_REVISION`: a
changed list (or a changed recipe, which bumps the revision) builds a new directory, an unchanged one is reused.

The recipe is data first: :func:`debootstrap_argv`, :func:`apt_argvs` and :func:`mount_argvs` render the commands
as argv lists that the unit tests pin, and :func:`ensure_rootfs`, :func:`mount` and :func:`unmount` run them.
Building happens in a temporary sibling directory renamed into place only when complete (a crash never leaves a
half-built cache entry behind under the final name), under a file lock (two builders never race). Importing this
module does nothing: no directory is made and no command runs until a function is called.

Mounts (:func:`mount`): ``proc``, ``/sys`` and ``/dev`` rbind-mounted and made rslave (an ``umount -R`` inside can
then never propagate to the host's own ``/dev/pts`` or cgroup mounts), a fresh tmpfs on ``/run`` (the host's /run
holds other clusters' sockets) and bind mounts of chosen host paths at the same path inside. :func:`unmount` removes
every one of them and checks ``/proc/self/mountinfo`` that none is left: a left-over ``/dev`` bind under a cache dir
would make a later ``rm -r`` of that dir delete the host's device nodes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from nuro.devcluster.install import InstallError, ensure_packages, machine_lock

log = logging.getLogger(__name__)

#: Slurm version -> the Debian suite whose ``slurm-wlm`` is that version (measured: trixie 24.11.5, sid 26.05.5).
VERSIONS: dict[str, str] = {"24.11": "trixie", "26.05": "sid"}

#: What a small accounting cluster needs inside: the four daemons' packages, the clients, munge, and MariaDB for
#: slurmdbd (``mariadb-client`` for ``mariadb-admin ping`` and the grant). ``slurm-wlm-basic-plugins`` (job_submit
#: lua, cgroup, topology) arrives as a dependency of slurmctld/slurmd.
COMMON_PACKAGES: tuple[str, ...] = (
    "slurmctld",
    "slurmd",
    "slurmdbd",
    "slurm-client",
    "munge",
    "mariadb-server",
    "mariadb-client",
)

#: Per-version additions: the libraries the host's Python 3.11 links (expat) or loads (``sqlite3``, ``ctypes``) when
#: a job runs the host's venv through a read-only bind mount, and git, which nuro's batch script runs inside the job
#: (``git archive`` of the pinned commit). Measured: neither minbase has libexpat1 (the host's python3.11 then fails
#: to start in a job), sid lacks the other two; without git every nuro-train job failed at its code checkout.
EXTRA_PACKAGES: dict[str, tuple[str, ...]] = {
    "24.11": ("git", "libexpat1", "libffi8", "libsqlite3-0"),
    "26.05": ("git", "libexpat1", "libffi8", "libsqlite3-0"),
}

#: Bump when the recipe changes in a way the package list does not show (mounts used while installing, files
#: written inside): every cache entry is then rebuilt once.
BUILD_REVISION = 2

CACHE_ROOT = Path("/var/cache/nuro/rootfs")

#: apt options per suite. sid's InRelease can look expired against this machine's clock (measured).
APT_OPTIONS: dict[str, tuple[str, ...]] = {"sid": ("-o", "Acquire::Check-Valid-Until=false")}

#: Files copied from the host into a new root before apt runs: munged looks its own host name up in /etc/hosts, and
#: apt inside must resolve the mirror's name.
HOST_FILES: tuple[str, ...] = ("/etc/hosts", "/etc/resolv.conf")

#: ``policy-rc.d`` answering 101 ("action forbidden") keeps package scripts from starting munge, MariaDB or Slurm on
#: their default ports while installing: other clusters on this host may use them, and we start our daemons
#: ourselves. It stays in the finished root for the same reason.
POLICY_RC_D = "#!/bin/sh\n# nuro rootfs: package scripts never start daemons; nuro starts its own.\nexit 101\n"

APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))

COMMAND_TIMEOUT_S = 900.0


class RootfsError(RuntimeError):
    """A build or mount step failed; the message names the step, the command and what to do."""


# ---------------------------------------------------------------------------------------------------------------
# Pure parts: names, package lists, rendered commands


#: Host packages a build needs (name → file it provides), installed on first use like the dev cluster's own.
BUILD_TOOLS = {
    "debootstrap": "/usr/sbin/debootstrap",
    "debian-archive-keyring": "/usr/share/keyrings/debian-archive-keyring.gpg",
}


def suite_of(version: str) -> str:
    """The Debian suite for a Slurm version (``"24.11"`` -> ``"trixie"``); raises with the known versions."""
    try:
        return VERSIONS[version]
    except KeyError:
        known = ", ".join(f"{v} ({s})" for v, s in VERSIONS.items())
        raise RootfsError(f"no root filesystem recipe for Slurm {version!r}; known versions: {known}") from None


def packages_of(version: str) -> tuple[str, ...]:
    """The packages installed inside the root filesystem of ``version``: sorted, without duplicates."""
    suite_of(version)
    return tuple(sorted({*COMMON_PACKAGES, *EXTRA_PACKAGES.get(version, ())}))


def cache_key(packages: Iterable[str], revision: int = BUILD_REVISION) -> str:
    """12 hex digits of sha256 over the sorted package list and the build revision.

    Order and duplicates do not matter (the same set installs the same root); a changed set or revision gives a new
    key and so a new directory, while the old one stays until someone removes it.
    """
    text = "\n".join(sorted(set(packages))) + f"\nrevision={revision}\n"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def cache_dir(version: str, root: Path = CACHE_ROOT) -> Path:
    """Where the root filesystem of ``version`` lives: ``<root>/<suite>-<cache_key(packages)>``."""
    return root / f"{suite_of(version)}-{cache_key(packages_of(version))}"


def record_path(rootfs: Path) -> Path:
    """The build record beside a root filesystem: ``<dir>.json`` (build seconds, disk bytes, Slurm version)."""
    return rootfs.with_name(rootfs.name + ".json")


def debootstrap_argv(suite: str, target: Path, mirror: str) -> list[str]:
    """``debootstrap --variant=minbase <suite> <target> <mirror>``: the smallest Debian that runs apt."""
    return ["debootstrap", "--variant=minbase", suite, str(target), mirror]


def apt_argvs(target: Path, version: str) -> list[list[str]]:
    """The apt commands run inside ``target`` (through ``chroot``): update, install without recommends, clean."""
    opts = list(APT_OPTIONS.get(suite_of(version), ()))
    chroot = ["chroot", str(target)]
    return [
        [*chroot, "apt-get", *opts, "update", "-qq"],
        [*chroot, "apt-get", *opts, "install", "-y", "-qq", "--no-install-recommends", *packages_of(version)],
        [*chroot, "apt-get", "clean"],
    ]


_ONE_LINE = re.compile(r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+\S+", re.MULTILINE)


def mirror_from_sources(texts: Iterable[str]) -> str:
    """The Debian archive URL in apt source files (deb822 ``.sources`` or one-line ``.list``), in the order given.

    The first ``deb`` entry whose URL path ends in ``/debian`` wins: that skips ``debian-security``, vendor
    repositories and ``deb-src`` entries, whose suites a trixie or sid root could not use anyway.
    """
    for text in texts:
        candidates: list[str] = []
        for stanza in re.split(r"\n\s*\n", text):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line or line[:1].isspace():
                    continue
                key, _, value = line.partition(":")
                fields[key.strip().lower()] = value.strip()
            if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes").lower() != "no":
                candidates += fields.get("uris", "").split()
        candidates += _ONE_LINE.findall(text)
        for uri in candidates:
            if uri.rstrip("/").endswith("/debian"):
                return uri.rstrip("/")
    raise RootfsError(
        "no Debian archive (a 'deb' entry whose URL ends in /debian) in the apt sources; "
        "pass mirror= to ensure_rootfs, e.g. http://deb.debian.org/debian"
    )


@dataclass(frozen=True)
class Bind:
    """A host path made visible at the same path inside the root: read-only unless ``writable``; ``recursive``
    (``--rbind``) brings what is mounted below it along (a dev cluster's state dir with its cgroup binds)."""

    path: str
    writable: bool = False
    recursive: bool = False

    def __post_init__(self) -> None:
        if not self.path.startswith("/") or self.path.rstrip("/") == "" or "\n" in self.path:
            raise RootfsError(f"bind path {self.path!r} must be an absolute path other than /")


def inside(root: Path, path: str) -> Path:
    """``path`` (absolute, host view) as seen under ``root``."""
    return root / path.lstrip("/")


def mount_argvs(root: Path, binds: Sequence[Bind] = ()) -> list[list[str]]:
    """The mount commands of :func:`mount`, in order: proc, /sys and /dev (rbind, then rslave), tmpfs /run, then
    each bind (parents before children; a read-only one is bound, then remounted ``ro``)."""
    argvs = [["mount", "-t", "proc", "proc", str(root / "proc")]]
    for special in ("sys", "dev"):
        argvs.append(["mount", "--rbind", f"/{special}", str(root / special)])
        argvs.append(["mount", "--make-rslave", str(root / special)])
    argvs.append(["mount", "-t", "tmpfs", "-o", "mode=755,nosuid,nodev", "tmpfs", str(root / "run")])
    for bind in sorted(binds, key=lambda b: b.path.rstrip("/").count("/")):
        target = str(inside(root, bind.path))
        argvs.append(["mount", "--rbind" if bind.recursive else "--bind", bind.path, target])
        if not bind.writable:
            argvs.append(["mount", "-o", "remount,bind,ro", target])
    return argvs


def _unescape_mountinfo(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as 3-digit octal escapes (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mounts_under(root: Path, mountinfo: str) -> list[str]:
    """Mount points strictly below ``root`` in a ``/proc/self/mountinfo`` text, in the order listed."""
    prefix = str(root).rstrip("/") + "/"
    found = []
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if len(fields) > 4:
            point = _unescape_mountinfo(fields[4])
            if point.startswith(prefix):
                found.append(point)
    return found


def top_mounts(points: Iterable[str]) -> list[str]:
    """The mount points not below another of ``points``: ``umount -R`` on each removes them all."""
    unique = sorted(set(points))
    return [p for p in unique if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in unique)]


# ---------------------------------------------------------------------------------------------------------------
# Side effects: build, mount, unmount


def run(argv: list[str], what: str, timeout_s: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    log.info("rootfs: %s: %s", what, " ".join(argv))
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LC_ALL": "C",
        "DEBIAN_FRONTEND": "noninteractive",
        "HOME": "/root",
    }
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, check=False, env=env, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired as exc:
        raise RootfsError(f"{what}: {' '.join(argv)} ran over {timeout_s:.0f} s") from exc
    except OSError as exc:  # the program itself is missing or not executable
        raise RootfsError(f"{what}: cannot run {argv[0]}: {exc.strerror}") from exc
    if proc.returncode != 0:
        tail = (proc.stderr.strip() or proc.stdout.strip())[-2000:]
        raise RootfsError(f"{what} failed (exit {proc.returncode}): {' '.join(argv)}\n{tail}")
    return proc


def system_mirror() -> str:
    """The Debian archive this machine's apt uses (:func:`mirror_from_sources` over its source files)."""
    texts = []
    for source in APT_SOURCES:
        files = sorted(source.glob("*.sources")) + sorted(source.glob("*.list")) if source.is_dir() else [source]
        for path in files:
            with contextlib.suppress(OSError):
                texts.append(path.read_text())
    return mirror_from_sources(texts)


def current_mounts(root: Path) -> list[str]:
    """Mount points below ``root`` right now (from ``/proc/self/mountinfo``)."""
    return mounts_under(root, Path("/proc/self/mountinfo").read_text())


def mount(root: Path, binds: Sequence[Bind] = ()) -> None:
    """Mount proc, /sys, /dev, a fresh /run and ``binds`` inside ``root`` (see :func:`mount_argvs`).

    Refuses a root that already has mounts (stacking a second set would leave the first behind after
    :func:`unmount`'s check). On a failure, what was mounted is unmounted again before the error is raised.
    """
    root = root.resolve()
    if left := current_mounts(root):
        raise RootfsError(f"{root} already has mounts ({', '.join(left[:4])}): call unmount({str(root)!r}) first")
    for bind in binds:
        if not Path(bind.path).exists():
            raise RootfsError(f"bind source {bind.path} does not exist on the host")
    try:
        run_mounts(root, mount_argvs(root, binds))
    except BaseException:
        unmount(root)
        raise


def run_mounts(root: Path, argvs: Sequence[list[str]]) -> None:
    """Run mount commands in order; a bind's target below ``root`` is made just before its mount, not up front (a
    target below /run must be made in the fresh tmpfs, one below an overlay in its upper layer)."""
    for argv in argvs:
        if argv[1] in ("--bind", "--rbind"):
            _make_target(root, Path(argv[2]), Path(argv[3]))
        run(argv, "mount", timeout_s=30)


def _placeholders(root: Path) -> Path:
    """The list of bind targets :func:`mount` created inside ``root``, removed again by :func:`unmount`."""
    return root / ".nuro-bind-targets"


def _make_target(root: Path, source: Path, target: Path) -> None:
    """An empty directory (or file, for a file bind) at ``target`` to mount ``source`` on, recorded when it is new:
    left behind, an empty placeholder shadows a real file of the same name in the cache (measured: a 0-byte
    libexpat.so.1 stopped every job's Python from starting)."""
    if target.exists() or target.is_symlink():
        return
    if source.is_dir():
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch(exist_ok=True)
    with open(_placeholders(root), "a") as fh:
        fh.write(f"{target}\n")


def _remove_placeholders(root: Path) -> None:
    """After every mount is gone: remove the empty bind targets :func:`mount` made, deepest first."""
    listing = _placeholders(root)
    if not listing.exists():
        return
    for line in sorted(set(listing.read_text().splitlines()), key=len, reverse=True):
        target = Path(line)
        with contextlib.suppress(OSError):  # not empty (something was written there), or already gone: kept
            if target.is_dir() and not target.is_symlink():
                target.rmdir()
            elif target.is_file() and target.stat().st_size == 0:
                target.unlink()
    listing.unlink()


def unmount(root: Path, timeout_s: float = 30.0) -> None:
    """Undo :func:`mount`: ``umount -R`` of every top mount below ``root`` (lazily if busy), then check that
    ``/proc/self/mountinfo`` lists nothing below ``root`` any more; raises if something is left."""
    root = root.resolve()
    deadline = time.monotonic() + timeout_s
    while points := current_mounts(root):
        for point in sorted(top_mounts(points), key=len, reverse=True):
            proc = subprocess.run(["umount", "-R", point], capture_output=True, text=True, check=False, timeout=30)
            if proc.returncode != 0:
                log.warning("rootfs: umount -R %s failed (%s): detaching lazily", point, proc.stderr.strip())
                subprocess.run(["umount", "-R", "-l", point], capture_output=True, check=False, timeout=30)
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)  # a lazy detach can take a moment to leave mountinfo
    if left := current_mounts(root):
        raise RootfsError(f"mounts left below {root} after unmount: {', '.join(left[:8])}")
    _remove_placeholders(root)


@contextlib.contextmanager
def mounted(root: Path, binds: Sequence[Bind] = ()) -> Iterator[Path]:
    """``with mounted(root, binds):`` mount, and unmount whatever happens inside."""
    mount(root, binds)
    try:
        yield root
    finally:
        unmount(root)


def _remove_tree(path: Path) -> None:
    """``rm -r`` a (half-built) root, but only once nothing is mounted below it: with /dev still bound, removing
    the tree would remove the host's device nodes."""
    if not path.exists():
        return
    unmount(path)
    shutil.rmtree(path)


def _disk_bytes(path: Path) -> int:
    out = run(["du", "-s", "-x", "-B1", str(path)], "measure disk use", timeout_s=300).stdout
    return int(out.split()[0])


def _build(version: str, tmp: Path, mirror: str, final: Path) -> str:
    """debootstrap into ``tmp``, then install the packages inside; returns the installed slurmctld version.

    ``<root>/<final path>`` is made a link to ``/``: a path below ``final`` then names the same file on the host and
    inside the chroot (slurm.conf's ``PluginDir``, which the host-side clients read too)."""
    suite = suite_of(version)
    run(debootstrap_argv(suite, tmp, mirror), f"debootstrap {suite}")
    self_link = inside(tmp, str(final))
    self_link.parent.mkdir(parents=True, exist_ok=True)
    self_link.symlink_to("/")
    policy = tmp / "usr/sbin/policy-rc.d"
    policy.write_text(POLICY_RC_D)
    policy.chmod(0o755)
    for name in HOST_FILES:
        with contextlib.suppress(FileNotFoundError):
            dest = inside(tmp, name)
            if dest.is_symlink():
                dest.unlink()
            shutil.copyfile(name, dest)
    with mounted(tmp):  # postinst scripts expect /proc, /dev and a writable /run
        for argv in apt_argvs(tmp, version):
            run(argv, f"apt inside the {suite} root")
        query = ["chroot", str(tmp), "dpkg-query", "-W", "-f", "${Version}", "slurmctld"]
        return run(query, "read the installed Slurm version").stdout.strip()


def read_record(rootfs: Path) -> dict | None:
    """The build record of a root filesystem, or None if it has none (or an unreadable one)."""
    try:
        return json.loads(record_path(rootfs).read_text())
    except (OSError, ValueError):
        return None


def ensure_rootfs(version: str, root: Path = CACHE_ROOT, mirror: str | None = None) -> Path:
    """The root filesystem of ``version``, built first if the cache has none. Needs root and the Debian mirror.

    Steps: lock (``install.machine_lock``: one builder per directory on this machine); if ``<dir>`` exists, return
    it; else remove a stale ``.<name>.tmp`` (a crashed build, unmounted first), debootstrap into it, write
    ``policy-rc.d``, copy /etc/hosts and /etc/resolv.conf, mount, apt-get update/install/clean inside, unmount,
    rename it to ``<dir>`` in one step and write the record ``<dir>.json``: version, suite, packages, mirror, the
    Slurm version installed, ``build_s`` and ``disk_bytes``. Raises :class:`RootfsError` with the failing step;
    nothing is left mounted either way.
    """
    final = cache_dir(version, root)
    if final.is_dir():
        return final
    if os.geteuid() != 0:
        raise RootfsError(f"building {final} needs root (debootstrap, chroot, mount); run as root once")
    try:  # a fresh machine has no debootstrap (the host side of the build; everything else runs inside)
        ensure_packages(packages=BUILD_TOOLS)
    except InstallError as exc:
        raise RootfsError(f"cannot build {final}: {exc}") from exc
    mirror = mirror or system_mirror()
    root.mkdir(parents=True, exist_ok=True)
    with machine_lock(f"rootfs-{final.name}"):
        if final.is_dir():  # built by another process while we waited for the lock
            return final
        tmp = final.with_name(f".{final.name}.tmp")
        _remove_tree(tmp)
        t0 = time.monotonic()
        try:
            slurm = _build(version, tmp, mirror, final)
        except BaseException:
            with contextlib.suppress(RootfsError):
                unmount(tmp)
            raise
        build_s = time.monotonic() - t0
        os.rename(tmp, final)  # the final name appears only complete
        record = {
            "version": version,
            "suite": suite_of(version),
            "packages": list(packages_of(version)),
            "build_revision": BUILD_REVISION,
            "mirror": mirror,
            "slurm_package_version": slurm,
            "build_s": round(build_s, 1),
            "disk_bytes": _disk_bytes(final),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        out = record_path(final)
        part = out.with_name(out.name + ".part")
        part.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(part, out)
        log.info("rootfs: built %s in %.0f s (%d MB)", final, build_s, record["disk_bytes"] // 1_000_000)
    return final
