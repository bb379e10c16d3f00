"""``nuro-mlflow-bridge``: the shared service that mirrors nuro's runs into MLflow (``nuro.tracking.bridge``).

    nuro-mlflow-bridge [--tracking-uri URL] [--interval-s 5] [--once] [--json]

Runs beside the controller with the platform's credentials (Slurm client, the metrics sink's platform login,
``NURO_S3_BUCKET``); the tracking server is ``--tracking-uri``, else ``MLFLOW_TRACKING_URI`` (MLflow's own variable;
``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD`` or ``MLFLOW_TRACKING_TOKEN`` when the server asks). Stops
on SIGTERM/SIGINT after the pass in progress. ``--once``: one pass, its counts as JSON with ``--json``; exit 0 when
the pass reached MLflow, 1 when it did not.

Jobs' progress (newest commit, preemption in flight, ack) comes from the controller's state dir
(``$NURO_CONTROLLER_STATE_DIR``, default ``/var/lib/nuro/controller``: its ``progress.json`` and ledger), root-only
files only the controller writes, never from a job's comment.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence

from nuro.objectstore import ObjectStore
from nuro.protocol.envnames import NURO_EVENT_LOG, NURO_S3_BUCKET
from nuro.runs.report import open_sink
from nuro.slurm import CliBackend
from nuro.slurm_plugins.controller.config import DEFAULT_STATE_DIR, ENV_STATE_DIR
from nuro.slurm_plugins.controller.ledger import Ledger
from nuro.slurm_plugins.controller.progress import ProgressFile
from nuro.tracking.bridge import Bridge, JobMarks, job_timeline, sink_gpu_rows, sink_rows, store_checkpoints
from nuro.tracking.mlflow import MlflowError, client_from_env

log = logging.getLogger("nuro.mlflow_bridge")


def controller_marks(state_dir: str) -> Callable[[int, tuple[str, ...]], JobMarks]:
    """``Bridge``'s ``marks``: a job's progress from the controller's progress file and preemption ledger (each read
    again only when it changed; a missing or unreadable file means nothing known)."""
    progress, ledger = ProgressFile(state_dir), Ledger(state_dir)

    def marks(job_id: int, nodes: tuple[str, ...]) -> JobMarks:
        heard = progress.view().get(job_id)
        p = heard.restricted_to(nodes) if heard is not None and nodes else heard  # a finished job lists no nodes
        signalled = ledger.current().get(job_id)
        return JobMarks(p.commit_step if p else None, signalled[0] if signalled else None, p.ack_step if p else None)

    return marks


def build(uri: str | None = None) -> Bridge:
    backend = CliBackend(timeout_s=30)
    try:
        client = client_from_env(uri)
    except MlflowError as exc:
        raise SystemExit(f"nuro-mlflow-bridge: {exc}") from None
    store = ObjectStore.from_env()
    return Bridge(client, backend.jobs, backend.finished_jobs, sink_rows(open_sink),
                  bucket=os.environ.get(NURO_S3_BUCKET, "nuro"), gpu_rows=sink_gpu_rows(open_sink),
                  checkpoints=store_checkpoints(store),
                  timeline=job_timeline(backend, os.environ.get(NURO_EVENT_LOG), store),
                  marks=controller_marks(os.environ.get(ENV_STATE_DIR) or DEFAULT_STATE_DIR))  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    what = "The shared service that mirrors nuro's runs into MLflow: an experiment per team, a run per job."
    p = argparse.ArgumentParser(prog="nuro-mlflow-bridge", description=what)
    p.add_argument("--tracking-uri", help="the MLflow server (default: $MLFLOW_TRACKING_URI)")
    p.add_argument("--interval-s", type=float, default=5.0, help="seconds between passes")
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    p.add_argument("--json", action="store_true", help="with --once: the pass's counts as JSON")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    bridge = build(args.tracking_uri)
    if args.once:
        before = bridge.stats.failures
        stats = bridge.sync_once()
        if args.json:
            print(json.dumps(vars(stats)))
        return 0 if stats.failures == before else 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log.info("mirroring nuro runs into %s every %.1f s", bridge.client.base_url, args.interval_s)
    while not stop.is_set():
        try:
            bridge.sync_once()
        except Exception:  # noqa: BLE001 - a pass that failed in an unforeseen way must not end the service
            log.exception("pass failed")
        stop.wait(args.interval_s)
    log.info("stopped: %s", vars(bridge.stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
