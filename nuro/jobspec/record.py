"""The run record (the job comment's ``nuro`` key) and the job environment derived from it: one function each.

Both submit paths build a run through these, so a job submitted with ``nuro-train submit`` (rendered script) and one
submitted with ``nuro-sbatch`` (the user's script) carry the same keys and see the same ``NURO_*`` variables:

* ``run_record``: what the run pins (team, tier, dataset digest and data seed, code commit, checkpoint policy,
  requeue budget, hot spares), as the bridge, the controller, ``nuro-train resume`` and accounting read it back.
  Only digests, never tags; no env values (they may be secrets).
* ``job_env``: the ``NURO_*`` variables the job's processes and the SDK read, computed from the record alone
  (the rendered script exports them; nuro-sbatch exports them into sbatch's environment and its preamble).
* ``comment_json``: the record as the job comment (canonical JSON, ``nuro.protocol.jobcomment``).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from typing import Any

from nuro.jobspec.codepin import CodePin
from nuro.jobspec.pins import DatasetPin
from nuro.protocol import jobcomment
from nuro.protocol.contract import PREEMPT_SIGNAL
from nuro.protocol.envnames import (
    NURO_CKPT_INTERVAL_S,
    NURO_CKPT_KEEP,
    NURO_DATA_SEED,
    NURO_DATASET,
    NURO_DATASET_DIGEST,
    NURO_DEEPSPEED_CONFIG,
    NURO_MAX_REQUEUES,
    NURO_PREEMPT_SIGNAL,
    NURO_RESUME_FROM,
    NURO_RUN_NAME,
    NURO_SNAPSHOT_INTERVAL_S,
    NURO_SPARE_NODES,
    NURO_TEAM,
)

#: Version of the ``nuro`` record in the job comment.
META_FORMAT = 1


def run_record(
    *,
    team: str,
    dataset: DatasetPin | None,
    code: CodePin | None,
    ckpt_interval_s: int,
    ckpt_keep: int,
    max_requeues: int,
    tier: str | None = None,
    resume_from: str | None = None,
    name: str | None = None,
    entry: Mapping[str, Any] | None = None,
    via: str | None = None,
    data_seed: int = 0,
    spare_nodes: int = 0,
    snapshot_interval_s: int = 0,
) -> dict[str, Any]:
    """The ``nuro`` record of a job comment. Keys without a value are left out (nuro-sbatch's script is the
    user's: no ``name``/``entry``; ``via`` names a submit path other than nuro-train's).
    """
    meta: dict[str, Any] = {"v": META_FORMAT}
    if via:
        meta["via"] = via
    if name:
        meta["name"] = name
    meta["team"] = team
    if tier:
        meta["tier"] = tier
    if dataset is not None:
        meta["dataset"] = {"name": dataset.name, "digest": dataset.digest}
        if data_seed:  # 0, the loader's default, is left out: records without a seed keep their bytes
            meta["data"] = {"seed": data_seed}
    if code is not None:
        meta["code"] = {"repo": code.repo, "commit": code.commit}
        if code.diff_sha256:
            meta["code"]["diff"] = code.diff_sha256
        if code.diff_uri:
            meta["code"]["diff_uri"] = code.diff_uri
    if entry is not None:
        meta["entry"] = dict(entry)
    meta["ckpt_policy"] = {"interval_s": ckpt_interval_s, "keep": ckpt_keep}
    if snapshot_interval_s:  # 0 (off) is left out: records without snapshots keep their bytes
        meta["ckpt_policy"]["snapshot_s"] = snapshot_interval_s
    if resume_from:
        meta["resume_from"] = resume_from
    meta["requeue"] = {"max": max_requeues}
    if spare_nodes:  # 0 is left out: records without spares keep their bytes
        meta["spares"] = {"nodes": spare_nodes}
    return meta


def job_env(meta: Mapping[str, Any]) -> dict[str, str]:
    """The ``NURO_*`` variables of a job with run record ``meta``, in the order the rendered script exports them."""
    env: dict[str, str] = {}
    if "name" in meta:
        env[NURO_RUN_NAME] = str(meta["name"])
    env[NURO_TEAM] = str(meta["team"])
    if "dataset" in meta:
        env[NURO_DATASET], env[NURO_DATASET_DIGEST] = str(meta["dataset"]["name"]), str(meta["dataset"]["digest"])
    if "data" in meta:
        env[NURO_DATA_SEED] = str(meta["data"]["seed"])
    env[NURO_CKPT_INTERVAL_S] = str(meta["ckpt_policy"]["interval_s"])
    env[NURO_CKPT_KEEP] = str(meta["ckpt_policy"]["keep"])
    if meta["ckpt_policy"].get("snapshot_s"):
        env[NURO_SNAPSHOT_INTERVAL_S] = str(meta["ckpt_policy"]["snapshot_s"])
    if "resume_from" in meta:
        env[NURO_RESUME_FROM] = str(meta["resume_from"])
    env[NURO_MAX_REQUEUES] = str(meta["requeue"]["max"])
    env[NURO_PREEMPT_SIGNAL] = PREEMPT_SIGNAL
    if "spares" in meta:
        env[NURO_SPARE_NODES] = str(meta["spares"]["nodes"])
    entry = meta.get("entry") or {}
    if entry.get("deepspeed_config"):  # the script passes it to deepspeed.initialize (config=...)
        env[NURO_DEEPSPEED_CONFIG] = str(entry["deepspeed_config"])
    return env


def export_lines(env: Mapping[str, str], names: Iterable[str]) -> list[str]:
    """``export NAME=<quoted value>`` for each of ``names`` that ``env`` holds, in that order (POSIX sh)."""
    return [f"export {name}={shlex.quote(env[name])}" for name in names if name in env]


def comment_json(meta: Mapping[str, Any]) -> str:
    """The job comment carrying ``meta`` under ``nuro`` (compact, sorted; size-checked by nuro.protocol.jobcomment)."""
    return jobcomment.merge(None, nuro=dict(meta))


__all__ = ["META_FORMAT", "comment_json", "export_lines", "job_env", "run_record"]
