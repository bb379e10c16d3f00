"""Retention: which committed checkpoints of a run to delete. The choice is a pure function; ``apply_retention``
reads the run's state from S3 and deletes.

Rules (``choose_deletions``):

| step is …                                   | kept? |
|---------------------------------------------|-------|
| one of the newest ``keep`` committed steps  | yes   |
| tagged (``tags/<tag>`` points at it)        | yes   |
| newer than the newest committed step        | yes — in flight, or torn but maybe still uploading |
| uncommitted, with fewer than ``keep`` committed steps newer than it | yes — it would be kept once committed |
| older than the ``keep`` newest committed steps, otherwise | deleted (committed, torn or given-up alike) |

So nothing is deleted that would be kept were it committed: two workers of one node (the job's inline one and the
node agent) may commit steps out of order, and the older step still uploading must not lose its objects because a
newer one committed first. A step removed anyway (``keep`` newer steps committed meanwhile) is given up by its
uploader (``nuro.checkpoint.upload``: its part vanished, a newer step is committed), never waited on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from nuro.checkpoint.layout import manifest_key, parse_step_name, run_prefix, step_prefix, tag_key, tags_prefix
from nuro.checkpoint.manifest import dumps, utc_now
from nuro.objectstore import TAG_MAX_BYTES, ObjectStore, ObjectTooLarge
from nuro.protocol.contract import DEFAULT_CKPT_KEEP

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepState:
    """What S3 holds for one step: ``committed`` = its manifest exists."""

    step: int
    committed: bool


def default_keep() -> int:
    """The platform's retention when a job's record names none: ``DEFAULT_CKPT_KEEP`` (3), the job spec's
    ``checkpoint.keep`` default, what every nuro-train job gets unless it asks otherwise."""
    return DEFAULT_CKPT_KEEP


def effective_keep(record_keep: int | None) -> int:
    """The ``keep`` root applies for a job: its record's (from the bridge-validated nuro record), else the
    platform default. Never the upload request's: that file is the job user's to write."""
    if record_keep is None:
        return default_keep()
    if type(record_keep) is not int or record_keep < 1:
        raise ValueError(f"keep must be an integer of at least 1, got {record_keep!r}")
    return record_keep


def choose_deletions(steps: Iterable[StepState], keep: int, tagged: Iterable[int] = ()) -> list[int]:
    """The steps to delete, ascending. ``keep`` >= 1 (keeping zero committed checkpoints would lose the run)."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1 (NURO_CKPT_KEEP), got {keep}")
    states = sorted(steps, key=lambda s: s.step)
    committed = [s.step for s in states if s.committed]
    if len(committed) < keep:  # every committed step is kept, and so would any uncommitted one be once committed
        return []
    kept = set(committed[-keep:]) | set(tagged)
    oldest_kept_committed = min(committed[-keep:])
    return [s.step for s in states if s.step not in kept and s.step < oldest_kept_committed]


def list_steps(store: ObjectStore, team: str, run: str) -> list[StepState]:
    """Every step prefix of the run and whether its manifest exists (one LIST, plus one HEAD per step)."""
    out: list[StepState] = []
    for prefix in store.list_prefixes(run_prefix(team, run)):
        step = parse_step_name(prefix.rstrip("/").rsplit("/", 1)[-1])
        if step is not None:
            out.append(StepState(step, store.exists(manifest_key(team, run, step))))
    return sorted(out, key=lambda s: s.step)


def tagged_steps(store: ObjectStore, team: str, run: str) -> set[int]:
    """Steps that tags point at; a malformed tag is ignored with a warning (it protects nothing)."""
    steps: set[int] = set()
    for info in store.list(tags_prefix(team, run)):
        try:
            step = json.loads(store.get(info.key, max_bytes=TAG_MAX_BYTES)[0])["step"]
            if type(step) is int:
                steps.add(step)
                continue
        except (ValueError, KeyError, TypeError, ObjectTooLarge):
            pass
        log.warning("ignoring malformed checkpoint tag key=%s", info.key)
    return steps


def tag_step(store: ObjectStore, team: str, run: str, step: int, tag: str) -> None:
    """Point ``tag`` at ``step`` so retention keeps it (overwrites an existing tag of that name)."""
    store.put(tag_key(team, run, tag), dumps({"step": step, "tag": tag, "at": utc_now()}))


def delete_step(store: ObjectStore, team: str, run: str, step: int) -> int:
    """Delete every object of one step, manifest first (so it stops being valid before its shards go)."""
    prefix = step_prefix(team, run, step)
    keys = [o.key for o in store.list(prefix)]
    mkey = manifest_key(team, run, step)
    if mkey in keys:
        store.delete(mkey)
        keys.remove(mkey)
    for key in keys:
        store.delete(key)
    return len(keys) + 1


def apply_retention(store: ObjectStore, team: str, run: str, keep: int) -> list[int]:
    """Delete what ``choose_deletions`` picks; returns the deleted steps."""
    doomed = choose_deletions(list_steps(store, team, run), keep, tagged_steps(store, team, run))
    for step in doomed:
        delete_step(store, team, run, step)
        log.info("retention team=%s run=%s deleted step=%d keep=%d", team, run, step, keep)
    return doomed
