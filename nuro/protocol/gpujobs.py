"""Which job holds which GPU of a node: the prolog records it, the node agent tags its ``gpu`` points with it.

Why: GPU telemetry is read per node, but nodes are shared (a 2-GPU job beside a 6-GPU one), so "the GPUs of the
run's nodes" is the wrong answer to "how busy are my run's GPUs". The prolog knows the job's GPUs on its node
(``SLURM_JOB_GPUS``, Slurm's gres indices); the agent, which reads NVML, does not. The hand-over is one small file
per (node, job) under the node's staging root, written atomically by the prolog (root), removed by the epilog, and
listed by the agent at each probe. A file the epilog never removed (a crashed node) names a job that no longer
runs; the prolog of the next job on those GPUs overwrites the claim (the newest file wins).

Index caveat: Slurm's indices follow the gres.conf ``File=`` order (``/dev/nvidia0..7``); they equal NVML's index
when device minor numbers follow the PCI bus order, which is the usual case (and what ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
assumes).

Layout: ``<staging root>/.gpu-jobs/<node>/<job id>.json`` = ``{"job": "123", "gpus": [0, 1], "tags": {...}}``.
The node level keeps emulated nodes that share one staging root (the dev cluster) apart.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path

from nuro.names import validate_job_id
from nuro.protocol.heartbeat import is_node_name
from nuro.protocol.jobrecord import JobRecord
from nuro.safeio.atomic import write_atomic

log = logging.getLogger(__name__)

DIR = ".gpu-jobs"
_TAG_KEYS = ("team", "run")


def parse_gpu_ids(text: str | None) -> tuple[int, ...]:
    """``SLURM_JOB_GPUS`` (``"0,1"``, also ``"0-3,6"``) → sorted indices; empty or unset → (). Raises ValueError
    on anything else, naming the text."""
    if not text or not text.strip():
        return ()
    out: set[int] = set()
    for part in text.split(","):
        a, sep, b = part.strip().partition("-")
        if not a.isdigit() or (sep and not b.isdigit()):
            raise ValueError(f"SLURM_JOB_GPUS={text!r}: expected GPU indices like 0,1 or 0-3")
        lo, hi = int(a), int(b) if sep else int(a)
        if hi < lo:
            raise ValueError(f"SLURM_JOB_GPUS={text!r}: range {part!r} runs backwards")
        out.update(range(lo, hi + 1))
    return tuple(sorted(out))


def _path(root: Path, node: str, job_id: str) -> Path:
    if not is_node_name(node):
        raise ValueError(f"node name {node!r} is not a valid Slurm node name")
    return root / DIR / node / f"{validate_job_id(job_id)}.json"


def record(root: Path, node: str, job_id: str, gpus: tuple[int, ...], tags: Mapping[str, str]) -> Path | None:
    """Write the job's claim on ``gpus`` (atomically: the agent never reads half a file). None when it has none."""
    path = _path(root, node, job_id)
    if not gpus:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"job": job_id, "gpus": list(gpus), "tags": {k: str(v) for k, v in tags.items() if k in _TAG_KEYS and v}}
    write_atomic(path, json.dumps(body, sort_keys=True).encode())
    return path


def claim(root: Path, rec: JobRecord, gpus: tuple[int, ...]) -> Path | None:
    """The prolog's claim for the job of ``rec`` (``nuro.protocol.jobrecord``): its node, job id and tags all come
    from the
    root-owned record (team = the job's Slurm account, run only from a nuro record of that team), never from the
    job comment, so a job cannot make its GPU points count as another team's."""
    return record(root, rec.node, str(rec.job_id), gpus, {"team": rec.team or "", "run": rec.run or ""})


def forget(root: Path, node: str, job_id: str) -> bool:
    """Remove the job's claim (epilog). True when there was one."""
    try:
        _path(root, node, job_id).unlink()
        return True
    except FileNotFoundError:
        return False


def gpu_tags(root: Path, node: str) -> dict[int, dict[str, str]]:
    """GPU index → the tags of the job holding it (``job``, and ``team``/``run`` when known), from the node's
    claims. Unreadable files are skipped (logged); where two claims name one GPU, the newest file wins."""
    folder = root / DIR / node
    try:
        files = [(p.stat().st_mtime_ns, p.name, p) for p in folder.glob("*.json")]
    except OSError:
        return {}
    out: dict[int, dict[str, str]] = {}
    for _, _, path in sorted(files):
        try:
            body = json.loads(path.read_text())
            job, gpus, tags = validate_job_id(body["job"]), body["gpus"], body.get("tags") or {}
            if not all(isinstance(g, int) and g >= 0 for g in gpus):
                raise ValueError("bad GPU list")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("gpu claim %s unreadable (%s): ignored", path, exc)
            continue
        for g in gpus:
            out[g] = {"job": job, **{k: str(v) for k, v in tags.items() if k in _TAG_KEYS and v}}
    return out


__all__ = ["DIR", "claim", "forget", "gpu_tags", "parse_gpu_ids", "record"]
