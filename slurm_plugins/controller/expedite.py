"""Start a job that nuro's detector requeued as soon as Slurm safely can, on releases without expedited requeue.

Why (issue 31): after a requeue Slurm holds the job PENDING for ``cred_expire + 1`` s (Reason=BeginTime; 6 s at the
floor, 121 s by default) before it may start again: 6–9 s of every recovery on 22.05 and 24.11 (25.11+ has
``--requeue=expedite``, which nuro's submit uses there). The delay protects the old attempt's launch credential and
lets slurmd finish tearing the old attempt down. Measured on 22.05 and 24.11 (the dev cluster, 38 trials) and read
in Slurm's source (``batch_requeue_fini`` in job_mgr.c sets the delay once the job stops COMPLETING; slurmd's
``cred_revoked`` refuses only credentials created in or before the second of the kill; ``_rpc_batch_job`` refuses a
job id it still runs, "do not launch second copy", and slurmctld then drains that node):

- ``scontrol update jobid=J StartTime=now`` is accepted and the job starts at the next scheduling pass, but only
  once the job is PENDING again: sent while it is still COMPLETING, it is overwritten with now + cred_expire + 1;
- the new attempt ran correctly on the very nodes the old one used (20/20 on 24.11, 8/8 on 22.05) whenever those
  nodes stayed up: slurmctld keeps the job COMPLETING until their epilogs are done, so PENDING means they are clean;
- it failed ("Duplicate jobid", node drained, job held) only when a node that was DOWN at the requeue was back in
  service at once: nothing waits for a DOWN node's teardown but the delay.

So the detector expedites only what it caused, and only when it is safe (``decide``): a job that ran on a node the
detector set DOWN (and DRAIN: nuro keeps the lost node out until its agent beats healthy again), now PENDING with a
higher restart count than before the loss, at least ``MIN_AFTER_KILL_S`` after the kill (a new credential is then
created in a later second than the revoke), while every node the detector took down for it is still down or
drained. Anything else (the job started, ended, was held, or the node came back) drops it: Slurm's own delay then
applies, as before. Pure: the detector reads the job states and applies ``UpdateStartTime``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

#: A new launch credential must be created in a later second than the revoke (whole seconds, slurmctld's clock).
MIN_AFTER_KILL_S = 2.0
#: How long a requeued job is watched for its PENDING state (a requeue finishes once the epilogs are done).
WATCH_S = 120.0


@dataclass(frozen=True)
class Watched:
    """A job that ran on a node the detector took down: its restart count then, the node, the kill's wall time."""

    job_id: int
    restarts: int
    node: str
    killed_at: float


@dataclass(frozen=True)
class Decision:
    expedite: tuple[Watched, ...]
    keep: tuple[Watched, ...]
    dropped: tuple[tuple[Watched, str], ...]


def decide(
    watched: Sequence[Watched],
    observed: Mapping[int, tuple[int, str] | None],
    node_out: Collection[str],
    now: float,
) -> Decision:
    """Which watched jobs to start now. ``observed``: job → (restart count, state) as Slurm says now (None: Slurm
    no longer knows it; a job missing from the mapping was not read this time and is kept); ``node_out``: the nodes
    that are still DOWN or DRAIN; ``now``: wall time."""
    expedite, keep, dropped = [], [], []
    for w in watched:
        if w.job_id not in observed:
            keep.append(w)
            continue
        seen = observed[w.job_id]
        if seen is None:
            dropped.append((w, "gone"))
            continue
        restarts, state = seen
        state = state.upper()
        if w.node not in node_out:
            dropped.append((w, f"{w.node} is back in service"))
        elif restarts <= w.restarts:  # not requeued (yet): still COMPLETING, or Slurm kept it running
            if now - w.killed_at < WATCH_S:
                keep.append(w)
            else:
                dropped.append((w, "not requeued"))
        elif not state.startswith("PENDING"):
            if state.startswith(("COMPLETING", "REQUEUE", "CONFIGURING")) and now - w.killed_at < WATCH_S:
                keep.append(w)  # the requeue is finishing (the survivors' epilogs)
            else:
                dropped.append((w, f"{state.lower()} already"))
        elif now - w.killed_at < MIN_AFTER_KILL_S:
            keep.append(w)
        else:
            expedite.append(w)
    return Decision(tuple(expedite), tuple(keep), tuple(dropped))


__all__ = ["MIN_AFTER_KILL_S", "WATCH_S", "Decision", "Watched", "decide"]
