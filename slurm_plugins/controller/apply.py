"""Carry out the engine's decisions through the Slurm adapter, idempotently, one outcome per decision.

The engine (``engine.decide``) only computes; this module is the only place the controller changes Slurm. Every
decision was taken on a snapshot that may be a second old, so Slurm refusing one (the job started, ended, or was
already moved) is an expected, logged outcome, never a crash; the next cycle decides again from fresh state.

| decision | Slurm calls |
|---|---|
| Borrow / Return | ``scontrol update jobid=J qos=<b-team / g-team>`` (pending jobs only) |
| Preempt | comment ``preempt={at, for, sig, why}`` (signed, ``protocol.marks``), then ``scancel -s USR1 --full J`` |
| Requeue | comment ``preempt`` removed (the next run is not a victim), then ``scontrol requeue J`` |
| SetSiteFactor | ``scontrol update jobid=J sitefactor=V`` |
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from nuro.protocol import marks
from nuro.protocol.contract import COMMENT_PREEMPT, PREEMPT_SIGNAL
from nuro.slurm import Backend, SlurmError, SlurmUnavailable
from nuro.slurm_plugins.controller.decisions import Borrow, Decision, Preempt, Requeue, Return, SetSiteFactor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    decision: object
    applied: bool
    message: str
    duration_s: float


def apply_decision(backend: Backend, decision: Decision, now: float, dry_run: bool = False) -> Outcome:
    """Apply one decision. Raises only ``SlurmUnavailable`` (the controller then skips the rest of the cycle)."""
    t0 = time.monotonic()
    job_id = int(decision.job_id)
    if dry_run:
        return Outcome(decision, False, "dry run", 0.0)
    try:
        match decision:
            case Borrow(to_qos=qos) | Return(to_qos=qos):
                backend.update_qos(job_id, qos)
                msg = f"qos -> {qos}"
            case Preempt():
                # signed (nuro.protocol.marks): a mark a user writes into their own comment never counts
                mark = marks.sign(job_id, round(now), decision.for_job_id, decision.reason)
                backend.merge_comment(job_id, **{COMMENT_PREEMPT: mark})
                backend.signal(job_id, PREEMPT_SIGNAL, full=True)
                msg = f"signalled {PREEMPT_SIGNAL}; waiting for its checkpoint ack"
            case Requeue(acked=acked):
                backend.merge_comment(job_id, **{COMMENT_PREEMPT: None})
                backend.requeue(job_id)
                msg = "requeued after ack" if acked else "requeued at grace end without ack"
            case SetSiteFactor(value=value):
                backend.update_site_factor(job_id, value)
                msg = f"sitefactor -> {value}"
            case _:
                raise TypeError(f"apply_decision: unknown decision {decision!r}")
    except SlurmUnavailable:
        raise
    except SlurmError as exc:
        # Expected when the snapshot is stale (job started, ended, moved): next cycle re-decides.
        log.warning("decision=%s job=%d not applied: %s", type(decision).__name__, job_id, exc)
        return Outcome(decision, False, str(exc), time.monotonic() - t0)
    return Outcome(decision, True, msg, time.monotonic() - t0)
