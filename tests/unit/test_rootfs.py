"""The pure parts of nuro.devcluster.rootfs: cache naming, rendered build and mount commands, apt source parsing,
mountinfo reading. The build itself runs only on a real host (tests/fixtures/slurm/capture_versions.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nuro.devcluster import rootfs
from nuro.devcluster.rootfs import Bind, RootfsError


def test_versions_map_to_the_suites_that_ship_them() -> None:
    assert rootfs.VERSIONS == {"24.11": "trixie", "26.05": "sid"}
    assert rootfs.suite_of("26.05") == "sid"
    with pytest.raises(RootfsError, match=r"known versions: 24\.11 \(trixie\), 26\.05 \(sid\)"):
        rootfs.suite_of("22.05")


def test_package_lists_are_sorted_and_both_add_the_venv_libraries() -> None:
    trixie, sid = rootfs.packages_of("24.11"), rootfs.packages_of("26.05")
    assert list(trixie) == sorted(trixie)
    for name in ("slurmctld", "slurmd", "slurmdbd", "slurm-client", "munge", "mariadb-server"):
        assert name in trixie and name in sid
    # the host's python3.11 links libexpat; sqlite3 and ctypes load the other two (a job runs the host's venv)
    for name in ("libexpat1", "libffi8", "libsqlite3-0"):
        assert name in trixie and name in sid


def test_cache_dir_is_outside_any_checkout_and_named_by_suite_and_hash() -> None:
    path = rootfs.cache_dir("24.11")
    assert path.parent == Path("/var/cache/nuro/rootfs")
    suite, _, digest = path.name.partition("-")
    assert suite == "trixie" and len(digest) == 12 and int(digest, 16) >= 0
    assert rootfs.cache_dir("26.05", Path("/tmp/c")).parent == Path("/tmp/c")
    assert rootfs.record_path(path) == path.with_name(path.name + ".json")


def test_cache_key_changes_with_the_package_list_or_revision_only() -> None:
    base = rootfs.cache_key(["slurmctld", "munge"])
    assert rootfs.cache_key(["munge", "slurmctld", "munge"]) == base  # order and duplicates do not matter
    assert rootfs.cache_key(["slurmctld", "munge", "curl"]) != base
    assert rootfs.cache_key(["slurmctld"]) != base
    assert rootfs.cache_key(["slurmctld", "munge"], revision=rootfs.BUILD_REVISION + 1) != base


def test_cache_dir_follows_the_package_list(monkeypatch: pytest.MonkeyPatch) -> None:
    before = rootfs.cache_dir("24.11")
    monkeypatch.setattr(rootfs, "COMMON_PACKAGES", (*rootfs.COMMON_PACKAGES, "curl"))
    after = rootfs.cache_dir("24.11")
    assert after != before and after.name.startswith("trixie-")


def test_debootstrap_argv() -> None:
    argv = rootfs.debootstrap_argv("trixie", Path("/c/.trixie-x.tmp"), "http://deb.debian.org/debian")
    assert argv == ["debootstrap", "--variant=minbase", "trixie", "/c/.trixie-x.tmp", "http://deb.debian.org/debian"]


def test_apt_argvs_run_inside_the_root_and_relax_sid_dates_only() -> None:
    target = Path("/c/root")
    update, install, clean = rootfs.apt_argvs(target, "26.05")
    assert update == ["chroot", "/c/root", "apt-get", "-o", "Acquire::Check-Valid-Until=false", "update", "-qq"]
    assert install[:8] == [
        "chroot", "/c/root", "apt-get", "-o", "Acquire::Check-Valid-Until=false", "install", "-y", "-qq",
    ]  # fmt: skip
    assert "--no-install-recommends" in install
    assert install[-len(rootfs.packages_of("26.05")) :] == list(rootfs.packages_of("26.05"))
    assert clean == ["chroot", "/c/root", "apt-get", "clean"]
    update, install, _ = rootfs.apt_argvs(target, "24.11")
    assert update == ["chroot", "/c/root", "apt-get", "update", "-qq"]
    assert "Acquire::Check-Valid-Until=false" not in install


def test_mount_argvs_order_and_read_only_binds() -> None:
    argvs = rootfs.mount_argvs(
        Path("/r"), [Bind("/opt/venv/lib", writable=True), Bind("/usr/bin/python3.11"), Bind("/opt")]
    )
    assert argvs == [
        ["mount", "-t", "proc", "proc", "/r/proc"],
        ["mount", "--rbind", "/sys", "/r/sys"],
        ["mount", "--make-rslave", "/r/sys"],
        ["mount", "--rbind", "/dev", "/r/dev"],
        ["mount", "--make-rslave", "/r/dev"],
        ["mount", "-t", "tmpfs", "-o", "mode=755,nosuid,nodev", "tmpfs", "/r/run"],
        ["mount", "--bind", "/opt", "/r/opt"],  # parents first (by depth, ties in the order given)
        ["mount", "-o", "remount,bind,ro", "/r/opt"],
        ["mount", "--bind", "/opt/venv/lib", "/r/opt/venv/lib"],  # writable: no remount
        ["mount", "--bind", "/usr/bin/python3.11", "/r/usr/bin/python3.11"],
        ["mount", "-o", "remount,bind,ro", "/r/usr/bin/python3.11"],
    ]


@pytest.mark.parametrize("path", ["relative/x", "/", "//", "/a\nb"])
def test_bind_refuses_paths_that_are_not_absolute_or_the_root(path: str) -> None:
    with pytest.raises(RootfsError):
        Bind(path)


MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
24 27 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw,mode=755
90 27 0:21 / /var/cache/nuro/rootfs/sid-1/proc rw,relatime - proc proc rw
91 27 0:6 / /var/cache/nuro/rootfs/sid-1/dev rw,relatime master:7 - devtmpfs devtmpfs rw,mode=755
92 91 0:24 / /var/cache/nuro/rootfs/sid-1/dev/pts rw,relatime master:8 - devpts devpts rw,mode=600
93 27 254:0 /work/my\\040dir /var/cache/nuro/rootfs/sid-1/work/my\\040dir ro,relatime - ext4 /dev/vda rw
94 27 0:21 / /var/cache/nuro/rootfs/sid-10/proc rw,relatime - proc proc rw
"""


def test_mounts_under_reads_mountinfo_and_unescapes_spaces() -> None:
    points = rootfs.mounts_under(Path("/var/cache/nuro/rootfs/sid-1"), MOUNTINFO)
    assert points == [
        "/var/cache/nuro/rootfs/sid-1/proc",
        "/var/cache/nuro/rootfs/sid-1/dev",
        "/var/cache/nuro/rootfs/sid-1/dev/pts",
        "/var/cache/nuro/rootfs/sid-1/work/my dir",
    ]  # sid-10 is another root, not below sid-1
    assert rootfs.top_mounts(points) == [
        "/var/cache/nuro/rootfs/sid-1/dev",
        "/var/cache/nuro/rootfs/sid-1/proc",
        "/var/cache/nuro/rootfs/sid-1/work/my dir",
    ]


DEB822 = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
"""


def test_mirror_from_deb822_skips_security() -> None:
    security_first = DEB822.split("\n\n")[1]
    assert rootfs.mirror_from_sources([security_first, DEB822]) == "http://deb.debian.org/debian"


def test_mirror_from_one_line_sources_skips_vendor_repositories() -> None:
    text = (
        "deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n"
        "deb-src http://src.example/debian bookworm main\n"
        "deb [signed-by=/k.gpg arch=amd64] http://mirror.example/debian/ bookworm main\n"
    )
    assert rootfs.mirror_from_sources([text]) == "http://mirror.example/debian"


def test_mirror_from_sources_without_debian_says_what_to_do() -> None:
    disabled = "Types: deb\nURIs: http://a/debian\nSuites: x\nEnabled: no\n"
    with pytest.raises(RootfsError, match="pass mirror="):
        rootfs.mirror_from_sources([disabled, "Types: deb-src\nURIs: http://b/debian\n"])


def test_bind_targets_mount_made_are_removed_again(tmp_path: Path) -> None:
    """A file bind's empty placeholder left in the cache shadowed the real library of that name (a 0-byte
    libexpat.so.1 stopped every job's Python): unmount removes the targets mount made, and only those."""
    root = tmp_path / "root"
    (root / "usr/lib").mkdir(parents=True)
    kept = root / "usr/lib/real.so"
    kept.write_bytes(b"elf")
    source_file, source_dir = tmp_path / "lib.so", tmp_path / "venv"
    source_file.write_bytes(b"x")
    source_dir.mkdir()
    rootfs._make_target(root, source_file, root / "usr/lib/libexpat.so.1")
    rootfs._make_target(root, source_dir, root / "work/venv")
    rootfs._make_target(root, source_file, kept)  # exists already: not recorded, never removed
    rootfs._remove_placeholders(root)
    assert not (root / "usr/lib/libexpat.so.1").exists() and not (root / "work/venv").exists()
    assert kept.read_bytes() == b"elf" and not (root / ".nuro-bind-targets").exists()
