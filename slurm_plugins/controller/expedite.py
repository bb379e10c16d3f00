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
  service at once: nothing waits for a DOWN node's teardown but the delay;
- and a surviving node that gets the new attempt within ``cred_expire`` of the old one's kill still remembers the
  job (slurmd's credential cache: ``cred_jobid_cached``), so it runs **no prolog** for it: no job record, no staging
  dir, the launch fails (the goodput soak's DeepSpeed run on 22.05, started 3.7 s after the kill with
  ``cred_expire=5``). Slurm's own delay counts from the requeue's end (``batch_requeue_fini``: now + cred_expire + 1);
  the memory to outlive counts from the kill, which comes earlier by the survivors' epilogs.

So the detector expedites only what it caused, and only when it is safe (``decide``): a job that ran on a node the
detector set DOWN (and DRAIN: nuro keeps the lost node out until its agent beats healthy again), now PENDING with a
higher restart count than before the loss, while every node the detector took down for it is still down or drained,
and once the survivors will run the new attempt's prolog:

- 23.02 and later (``REISSUE_PURGES_SINCE``): slurmd drops the old attempt's entry as soon as a credential created in
  a later second than its revoke arrives (``cred_handle_reissue``, read in 23.02's and 24.11's source). PENDING
  means every survivor's epilog is done, so their revokes came before the first tick that saw it PENDING: the start
  is sent from the next whole second on (``pending_at``), and the new credential is newer than every revoke;
- 22.05: that purge runs at most once per 2 s, so the entry may outlive the reissue (SchedMD bug 15656): the start
  waits ``cred_expire + MARGIN_S`` from the kill, by when every survivor has forgotten the old attempt.

What it saves: on 23.02+ Slurm's whole ``cred_expire + 1`` s delay; on 22.05 the survivors' epilog time plus Slurm's
wait for its next scheduling pass after the BeginTime (``StartTime=now`` triggers one). Anything else (the job
started, ended, was held, or the node came back) drops it: Slurm's own delay then applies, as before. Pure: the
detector reads the job states and applies ``UpdateStartTime``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

# Slurm's cred_expire when the caller does not know it (slurm.conf's default): then nothing is expedited in practice
from nuro.slurm.parse_text import DEFAULT_CRED_EXPIRE_S

#: After the kill, beyond cred_expire: whole-second credential times, and the kill reaching the survivors' slurmd.
MARGIN_S = 2.0
#: How long a requeued job is watched for its PENDING state (a requeue finishes once the epilogs are done).
WATCH_S = 120.0
#: With a purging slurmd, the first read of a watched job comes this long after the kill (a requeue needs the
#: detection and the survivors' epilogs first): no squeue per tick for a job that cannot be PENDING yet.
FIRST_READ_S = 1.0


def earliest_start_s(cred_expire_s: float, reissue_purges: bool) -> float:
    """Seconds after the kill before which a watched job is never started (nor read)."""
    return FIRST_READ_S if reissue_purges else cred_expire_s + MARGIN_S


@dataclass(frozen=True)
class Watched:
    """A job that ran on a node the detector took down: its restart count then, the node, the kill's wall time."""

    job_id: int
    restarts: int
    node: str
    killed_at: float
    #: when a tick first saw it PENDING after the requeue (wall time); None before
    pending_at: float | None = None


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
    cred_expire_s: float = DEFAULT_CRED_EXPIRE_S,
    reissue_purges: bool = False,
) -> Decision:
    """Which watched jobs to start now. ``observed``: job → (restart count, state) as Slurm says now (None: Slurm
    no longer knows it; a job missing from the mapping was not read this time and is kept); ``node_out``: the nodes
    that are still DOWN or DRAIN; ``now``: wall time; ``cred_expire_s``: slurm.conf's AuthInfo cred_expire;
    ``reissue_purges``: this Slurm is ``REISSUE_PURGES_SINCE`` or later. A job kept after its first PENDING sighting
    comes back with ``pending_at`` set."""
    ready_after = earliest_start_s(cred_expire_s, reissue_purges)
    watch_s = max(WATCH_S, cred_expire_s + MARGIN_S + 30.0)
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
            if now - w.killed_at < watch_s:
                keep.append(w)
            else:
                dropped.append((w, "not requeued"))
        elif not state.startswith("PENDING"):
            if state.startswith(("COMPLETING", "REQUEUE", "CONFIGURING")) and now - w.killed_at < watch_s:
                keep.append(w)  # the requeue is finishing (the survivors' epilogs)
            else:
                dropped.append((w, f"{state.lower()} already"))
        elif now - w.killed_at < ready_after:
            keep.append(w)
        elif reissue_purges and (w.pending_at is None or now < math.floor(w.pending_at) + 1):
            keep.append(w if w.pending_at is not None else replace(w, pending_at=now))
        else:
            expedite.append(w)
    return Decision(tuple(expedite), tuple(keep), tuple(dropped))


__all__ = [
    "DEFAULT_CRED_EXPIRE_S",
    "FIRST_READ_S",
    "MARGIN_S",
    "WATCH_S",
    "Decision",
    "Watched",
    "decide",
    "earliest_start_s",
]
