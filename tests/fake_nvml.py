"""Build the fake ``libnvidia-ml.so.1`` (tests/fixtures/fake_nvml) and run code against it in subprocesses.

Why subprocesses: pynvml loads the library once per process (``CDLL("libnvidia-ml.so.1")``, cached in a global)
and the fake reads its scenario at ``nvmlInit``, so each scenario gets a fresh interpreter with
``LD_LIBRARY_PATH`` pointing at the built library and ``FAKE_NVML_CONFIG`` at the scenario file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

SOURCE = Path(__file__).parent / "fixtures" / "fake_nvml" / "fake_nvml.c"
LIBNAME = "libnvidia-ml.so.1"


def build(out_dir: str | Path) -> Path:
    """Compile the fake into ``out_dir/libnvidia-ml.so.1``; returns the directory for LD_LIBRARY_PATH.

    Raises:
        RuntimeError: gcc is missing or the build failed (with gcc's output).
    """
    gcc = shutil.which("gcc")
    if gcc is None:
        raise RuntimeError("gcc not found: install it (apt-get install gcc) to build the fake NVML library")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = [gcc, "-shared", "-fPIC", "-O1", "-Wall", "-o", str(out_dir / LIBNAME), str(SOURCE)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"building the fake NVML failed: {' '.join(argv)}\n{proc.stderr}")
    return out_dir


def write_scenario(path: str | Path, settings: Mapping[str, object]) -> Path:
    """Write a KEY=VALUE scenario file for the fake (keys as documented in fake_nvml.c)."""
    path = Path(path)
    path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    return path


def env_for(lib_dir: str | Path, scenario: str | Path | None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """An environment in which pynvml loads the fake with ``scenario``."""
    env = dict(os.environ if base is None else base)
    env["LD_LIBRARY_PATH"] = f"{lib_dir}:{env['LD_LIBRARY_PATH']}" if env.get("LD_LIBRARY_PATH") else str(lib_dir)
    if scenario is not None:
        env["FAKE_NVML_CONFIG"] = str(scenario)
    return env
