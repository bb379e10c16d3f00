"""Per-job and per-node failure isolation around ``engine.decide``: a record that makes the policy code raise costs
only its own job (or node), logged once, never the cycle of every other job.

Why: jobs' comments are written by their owners, and a record no rule foresaw (a comment nested a thousand levels
deep, a field of an odd type, a Slurm state string nobody handled) used to raise out of ``decide`` and end the
policy loop; with it, borrowing, reclaim and fair share stopped for all four teams.

How (only when ``decide`` raises; the normal cycle costs one dict lookup): the culprit is searched by halving the
suspects while keeping the context (``_culprit``): with S the records still in, a half A is dropped when ``decide``
still raises without it, else the culprit is in A. That finds a job whose comment is parsed only when another
pending job needs room (dropping the other job alone would hide it) in about log2(n) extra ``decide`` calls. The
culprit is then *quarantined*:

- a job is kept in the snapshot with an empty comment when that no longer raises (its GPUs still count, so nothing
  is placed onto them), else left out; either way no decision about it is applied (``filter``) until its record
  changes (a new fingerprint) or it leaves Slurm;
- a node (when ``decide`` raises even without jobs) is left out of the snapshot.

Up to ``MAX_CULPRITS`` per cycle; past that (or when the failure needs several records together) the cycle is
skipped with the error, and the next cycle tries again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from nuro.slurm.models import ClusterSnapshot, JobInfo, NodeInfo

MAX_CULPRITS = 16
T = TypeVar("T", JobInfo, NodeInfo)


@dataclass(frozen=True)
class Skipped:
    """A record quarantined by the isolator (``job_id`` for a job, ``node`` for a node)."""

    error: str
    job_id: int | None = None
    node: str | None = None
    kept_without_comment: bool = False

    def describe(self) -> str:
        if self.job_id is not None:
            how = "kept with an empty comment" if self.kept_without_comment else "left out of the cycle"
            return f"job={self.job_id} skipped (its record makes the policy code raise; {how}): {self.error}"
        return f"node={self.node} left out of the cycle (its record makes the policy code raise): {self.error}"


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def _fingerprint(record: JobInfo | NodeInfo) -> str:
    """What a quarantine is keyed on: the fields a record's owner controls (a job's comment, name, account, QOS),
    or a node's description. Not its priority or state, which move every few cycles: a change there would search
    and log the same bad record again."""
    if isinstance(record, JobInfo):
        return repr((record.comment, record.name, record.account, record.qos, record.user))
    return repr((record.state, record.reason, record.gres, record.gpus_total, record.partitions, record.switch))


class Isolator:
    """Runs a cycle's ``decide_fn(snapshot)`` (the daemon binds policy, state and time) with quarantined records
    handled as above; keeps the quarantine between cycles."""

    def __init__(self) -> None:
        self.jobs: dict[int, tuple[str, Skipped]] = {}  # job id → (fingerprint of the record, why)
        self.nodes: dict[str, tuple[str, Skipped]] = {}

    # -- the snapshot the engine sees ---------------------------------------------------------------------------
    def _forget_changed(self, snapshot: ClusterSnapshot) -> list[Skipped]:
        """Drop quarantine entries whose record changed or left Slurm (they are judged again); return them."""
        released = []
        for job_id, (fp, why) in list(self.jobs.items()):
            job = snapshot.job(job_id)
            if job is None or _fingerprint(job) != fp:
                del self.jobs[job_id]
                released.append(why)
        for name, (fp, why) in list(self.nodes.items()):
            node = snapshot.node(name)
            if node is None or _fingerprint(node) != fp:
                del self.nodes[name]
                released.append(why)
        return released

    def _clean(self, snapshot: ClusterSnapshot) -> ClusterSnapshot:
        if not self.jobs and not self.nodes:
            return snapshot
        jobs = []
        for job in snapshot.jobs:
            entry = self.jobs.get(job.job_id)
            if entry is None:
                jobs.append(job)
            elif entry[1].kept_without_comment:
                jobs.append(replace(job, comment=""))
        nodes = tuple(n for n in snapshot.nodes if n.name not in self.nodes)
        return replace(snapshot, jobs=tuple(jobs), nodes=nodes)

    def filter(self, decisions: Sequence) -> list:
        """The decisions that do not concern a quarantined job (as the target or as the job room is made for)."""
        if not self.jobs:
            return list(decisions)
        bad = self.jobs.keys()
        return [d for d in decisions if d.job_id not in bad and getattr(d, "for_job_id", None) not in bad]

    # -- the search -----------------------------------------------------------------------------------------------
    def run(
        self, snapshot: ClusterSnapshot, decide_fn: Callable[[ClusterSnapshot], object]
    ) -> tuple[object | None, list[Skipped], list[Skipped], str]:
        """(decide's result or None when the cycle had to be skipped, newly quarantined, released, error)."""
        released = self._forget_changed(snapshot) if (self.jobs or self.nodes) else []
        new: list[Skipped] = []
        last_error = ""
        for _ in range(MAX_CULPRITS + 1):
            clean = self._clean(snapshot)
            try:
                return decide_fn(clean), new, released, ""
            except Exception as exc:  # noqa: BLE001 - any bug a record can trigger is isolated here
                last_error = _error(exc)
            if len(new) >= MAX_CULPRITS:
                break
            found = self._find(clean, decide_fn)
            if found is None:
                break
            new.append(found)
        return None, new, released, last_error

    def _find(self, clean: ClusterSnapshot, decide_fn: Callable[[ClusterSnapshot], object]) -> Skipped | None:
        def raises(snap: ClusterSnapshot) -> str | None:
            try:
                decide_fn(snap)
                return None
            except Exception as exc:  # noqa: BLE001
                return _error(exc)

        if raises(replace(clean, jobs=())) is None:
            job = _culprit(list(clean.jobs), lambda js: raises(replace(clean, jobs=tuple(js))) is not None)
            if job is None:
                return None
            rest = [j for j in clean.jobs if j.job_id != job.job_id]
            error = raises(replace(clean, jobs=(*rest, job))) or "raised"
            keep = raises(replace(clean, jobs=(*rest, replace(job, comment="")))) is None
            why = Skipped(error, job_id=job.job_id, kept_without_comment=keep)
            self.jobs[job.job_id] = (_fingerprint(job), why)
            return why
        node = _culprit(list(clean.nodes), lambda ns: raises(replace(clean, jobs=(), nodes=tuple(ns))) is not None)
        if node is None:
            return None
        error = raises(replace(clean, jobs=(), nodes=(node,))) or "raised"
        why = Skipped(error, node=node.name)
        self.nodes[node.name] = (_fingerprint(node), why)
        return why


def _culprit(items: list[T], raises: Callable[[list[T]], bool]) -> T | None:
    """One record without which ``raises`` stops raising, found by halving (see the module docstring).

    Invariant: ``raises(S)`` and not ``raises(S - candidates)``; needs ``raises(items)`` and not ``raises([])``.
    None when that does not hold (the failure needs no record, or several records together).
    """
    if not items or not raises(items) or raises([]):
        return None
    context, candidates = list(items), list(items)
    while len(candidates) > 1:
        half = candidates[: len(candidates) // 2]
        drop = {id(x) for x in half}
        without = [x for x in context if id(x) not in drop]
        if raises(without):
            context, candidates = without, candidates[len(half) :]
        else:
            candidates = half
    return candidates[0]


__all__ = ["MAX_CULPRITS", "Isolator", "Skipped"]
