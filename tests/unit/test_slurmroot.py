"""The pure parts of ``devcluster up --slurm``: version checks, client wrappers, the overlay plan and its mounts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from nuro.cluster.slurmconf import render_slurm_conf
from nuro.devcluster import slurmroot
from nuro.devcluster.layout import Layout, describe
from nuro.devcluster.manager import render_env_sh

ROOT = Path("/var/cache/nuro/rootfs/trixie-0123456789ab")


def test_supported_versions_are_the_host_and_the_recipes() -> None:
    assert slurmroot.SUPPORTED == ("22.05", "24.11", "26.05")
    assert slurmroot.check_version("26.05") == "26.05"
    with pytest.raises(slurmroot.SlurmRootError, match=r"'25.05' is not supported.*22.05, 24.11, 26.05"):
        slurmroot.check_version("25.05")


def test_the_host_version_needs_no_root_and_no_wrappers(tmp_path: Path) -> None:
    host = slurmroot.resolve("22.05")
    assert (host.chrooted, host.plugin_dir(), host.client_argv("squeue"), host.clients()) == (
        False, None, ["squeue"], []
    )  # fmt: skip
    stale = tmp_path / "bin" / "squeue"
    stale.parent.mkdir()
    stale.write_text("old")
    assert slurmroot.write_wrappers(host, tmp_path / "bin", tmp_path / "slurm.conf") == []
    assert not stale.exists(), "a cluster switched back to 22.05 keeps no newer client on PATH"


def test_client_runs_through_the_roots_loader_with_its_libraries() -> None:
    install = slurmroot.SlurmInstall("24.11", ROOT)
    assert install.client_argv("sbatch") == [
        f"{ROOT}/lib64/ld-linux-x86-64.so.2", "--argv0", "sbatch", "--library-path",
        f"{ROOT}/usr/lib/x86_64-linux-gnu/slurm-wlm:{ROOT}/usr/lib/x86_64-linux-gnu", f"{ROOT}/usr/bin/sbatch",
    ]  # fmt: skip
    assert install.plugin_dir() == f"{ROOT}/usr/lib/x86_64-linux-gnu/slurm-wlm"


def test_wrapper_keeps_a_given_slurm_conf_and_passes_arguments(tmp_path: Path) -> None:
    """Run the rendered wrapper with /bin/sh, the loader swapped for a script that prints what it got."""
    root = tmp_path / "root"
    loader = root / slurmroot.LOADER
    loader.parent.mkdir(parents=True)
    loader.write_text('#!/bin/sh\necho "$SLURM_CONF"\nfor a in "$@"; do echo "[$a]"; done\n')
    loader.chmod(0o755)
    script = tmp_path / "squeue"
    script.write_text(slurmroot.SlurmInstall("26.05", root).wrapper_script("squeue", tmp_path / "my conf"))
    script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    out = subprocess.run([str(script), "--json", "a b"], env=env, capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert lines[0] == f"{tmp_path}/my conf"
    assert lines[1:4] == ["[--argv0]", "[squeue]", "[--library-path]"]
    assert lines[-2:] == ["[--json]", "[a b]"]
    out = subprocess.run([str(script)], env={**env, "SLURM_CONF": "/etc/other.conf"}, capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    assert out.splitlines()[0] == "/etc/other.conf"


def test_wrappers_only_for_clients_the_root_has(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    for name in ("squeue", "sbatch", "sed"):
        (root / "usr/bin" / name).touch()
    written = slurmroot.write_wrappers(slurmroot.SlurmInstall("24.11", root), tmp_path / "bin", tmp_path / "c")
    assert sorted(p.name for p in written) == ["sbatch", "squeue"]
    assert all(p.stat().st_mode & 0o777 == 0o755 for p in written)


def test_plan_binds_state_recursively_and_drops_nested_readonly_paths(tmp_path: Path) -> None:
    install = slurmroot.SlurmInstall("24.11", ROOT)
    checkout, state, sockets = "/src/nuro", "/src/nuro/.devcluster", "/run/nuro-dc-0123456789ab"
    plan = slurmroot.plan_root(install, Path(state), Path(sockets), Path(f"{checkout}/.venv"), Path(checkout))
    assert plan.recursive == (state,)
    assert plan.writable[:2] == (sockets, "/tmp")
    assert plan.readonly == (checkout, "/usr/bin/python3.11", "/usr/lib/python3.11"), "the venv is in the checkout"
    assert (plan.lower, plan.upper, plan.merged) == (ROOT, Path(state) / "rootfs/upper", Path(sockets) / "root")


def test_mounts_overlay_first_then_parents_before_children() -> None:
    install = slurmroot.SlurmInstall("26.05", ROOT)
    plan = slurmroot.plan_root(install, Path("/src/n/.dc"), Path("/run/nuro-dc-x"), Path("/opt/venv"), Path("/src/n"))
    argvs = slurmroot.mount_argvs(plan)
    m = "/run/nuro-dc-x/root"
    layers = f"lowerdir={ROOT},upperdir=/src/n/.dc/rootfs/upper,workdir=/src/n/.dc/rootfs/work"
    assert argvs[0] == ["mount", "-t", "overlay", "overlay", "-o", layers, m]
    targets = [a[-1] for a in argvs if a[1] in ("--bind", "--rbind")]
    assert targets.index(f"{m}/src/n") < targets.index(f"{m}/src/n/.dc"), "the checkout is bound before the state"
    assert targets.index(f"{m}/run/nuro-dc-x") > 0 and f"{m}/run" in [a[-1] for a in argvs if "tmpfs" in a]
    assert ["mount", "--rbind", "/src/n/.dc", f"{m}/src/n/.dc"] in argvs, "with its cgroup binds"
    assert ["mount", "--bind", "/run/nuro-dc-x", f"{m}/run/nuro-dc-x"] in argvs, "not recursive: it holds the root"
    assert ["mount", "-o", "remount,bind,ro", f"{m}/opt/venv"] in argvs
    assert ["mount", "-o", "remount,bind,ro", f"{m}{slurmroot.HOST_ETC}"] in argvs


def test_daemons_chroot_only_for_a_root() -> None:
    assert slurmroot.daemon_argv(None, ["slurmctld", "-D"]) == ["slurmctld", "-D"]
    plan = slurmroot.plan_root(
        slurmroot.SlurmInstall("24.11", ROOT), Path("/s"), Path("/run/x"), Path("/v"), Path("/c")
    )
    assert slurmroot.daemon_argv(plan, ["slurmd", "-D", "-N", "gpu001"]) == [
        "chroot", "/run/x/root", "slurmd", "-D", "-N", "gpu001"
    ]  # fmt: skip


def test_plugin_dir_reaches_slurm_conf_only_when_given(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "dc")
    assert "PluginDir" not in render_slurm_conf(describe(layout, 2, 22800))
    conf = render_slurm_conf(describe(layout, 2, 22800, plugin_dir=f"{ROOT}/usr/lib/x86_64-linux-gnu/slurm-wlm"))
    assert f"PluginDir={ROOT}/usr/lib/x86_64-linux-gnu/slurm-wlm\n" in conf


def test_env_prepends_the_wrappers_for_a_newer_slurm_only(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "dc")
    layout.etc.mkdir(parents=True)
    layout.ports_file.write_text('{"port_base": 22800}\n')
    assert "PATH" not in render_env_sh(layout)
    layout.ports_file.write_text('{"port_base": 22800, "slurm": "26.05"}\n')
    assert f'export PATH={layout.slurm_bin}:"$PATH"\n' in render_env_sh(layout)
