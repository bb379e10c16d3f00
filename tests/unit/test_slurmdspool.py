"""slurmd's job-state cache from before a crash is cleared before slurmd starts (nuro.healthcheck.slurmdspool), and
the compute role's drop-in that runs it (nuro.cluster.slurmconf.render_slurmd_dropin)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nuro.cluster.slurmconf import render_slurmd_dropin
from nuro.healthcheck import slurmdspool


def _written(path: Path, at: float) -> Path:
    path.write_bytes(b"\x00state")
    os.utime(path, (at, at))
    return path


def test_boot_time_is_the_kernels_btime(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  1 2 3\nintr 5\nbtime 1796400000\nprocesses 9\n")
    assert slurmdspool.boot_time(stat) == 1796400000.0
    stat.write_text("cpu 1\n")
    with pytest.raises(ValueError, match="no btime"):
        slurmdspool.boot_time(stat)
    assert slurmdspool.boot_time() > 0  # this host's


def test_only_state_written_before_the_boot_is_removed(tmp_path: Path) -> None:
    boot = 1_796_400_000.0
    old = _written(tmp_path / "cred_state", boot - 60)
    rotated = _written(tmp_path / "cred_state.old", boot - 120)
    other = _written(tmp_path / "hwloc_topo_whole.xml", boot - 60)  # not slurmd's job state: left alone
    assert slurmdspool.stale_files(tmp_path, boot) == [old, rotated]
    assert slurmdspool.clear_stale(tmp_path, boot) == [old, rotated]
    assert not old.exists() and not rotated.exists() and other.exists()
    assert slurmdspool.clear_stale(tmp_path, boot) == []  # nothing left, nothing to do


def test_a_plain_slurmd_restart_keeps_its_state(tmp_path: Path) -> None:
    """Written since the boot: running steps may be behind it, and Slurm's replay protection."""
    boot = 1_796_400_000.0
    fresh = _written(tmp_path / "cred_state", boot + 3600)
    assert slurmdspool.clear_stale(tmp_path, boot) == [] and fresh.exists()


def test_a_link_is_removed_not_followed(tmp_path: Path) -> None:
    target = _written(tmp_path / "elsewhere", 1.0)
    (tmp_path / "spool").mkdir()
    link = tmp_path / "spool" / "cred_state"
    link.symlink_to(target)
    os.utime(link, (1.0, 1.0), follow_symlinks=False)
    assert slurmdspool.clear_stale(tmp_path / "spool", 1000.0) == [link]
    assert target.exists() and not link.is_symlink()


def test_the_command_never_fails_slurmds_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _written(tmp_path / "cred_state", 1.0)
    assert slurmdspool.main(["--spool", str(tmp_path)]) == 0
    assert "cred_state (written before this boot)" in capsys.readouterr().out
    assert slurmdspool.main(["--spool", str(tmp_path / "missing")]) == 0


def test_the_drop_in_runs_it_before_slurmd_and_never_blocks_it() -> None:
    text = render_slurmd_dropin("/opt/nuro/venv/bin/python", "/var/spool/slurmd")
    assert text.splitlines()[1:] == [
        "[Service]",
        "ExecStartPre=-/opt/nuro/venv/bin/python -m nuro.healthcheck.slurmdspool --spool /var/spool/slurmd",
    ]
    for bad in ("relative/python", "/opt/with space/python", "/opt/%n/python"):
        with pytest.raises(ValueError, match="slurmd drop-in paths must be absolute and plain"):
            render_slurmd_dropin(bad, "/var/spool/slurmd")
