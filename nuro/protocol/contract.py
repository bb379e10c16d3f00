"""The job <-> platform contract: the numbers and names both sides of a running job must agree on.

The batch script nuro renders, the launcher on each node (``nuro-launch``), the training SDK inside the workers and
the controller each act on these. A value defined twice drifts (a launcher that exits 75 while the script waits for
76 requeues nothing), so every side reads it from here. Dependency-free on purpose: the SDK imports it inside the
training process and the renderer on login nodes, neither should pull anything else in.

| name | value | who acts on it |
|---|---|---|
| ``EXIT_REQUEUE`` | 75 (``EX_TEMPFAIL``) | launcher and SDK exit with it; the batch script requeues itself on it |
| ``PREEMPT_SIGNAL`` | ``USR1`` | the controller sends it (``scancel --signal=USR1 --full``); the SDK exits 75 |
| ``TIME_LIMIT_SIGNAL`` | ``USR2`` | Slurm sends it before the limit (``--signal=B:USR2@N``); the script relays it |
| ``PG_TIMEOUT_S`` | 60 | torch.distributed process-group timeout: how long a survivor waits for a lost peer |
| ``RDZV_PORT_BASE``/``SPAN`` | 29500 / 1000 | torchrun's rendezvous port: base + job id mod span |
| ``DEFAULT_CKPT_KEEP`` | 3 | the job spec's ``checkpoint.keep`` default; root's retention when a record names none |
| ``COMMENT_RUN`` | the job comment's one key | submit writes the run record (``nuro.protocol.jobcomment``) |
| ``NOTE_*`` | the admin comment's keys | root's notes to the job's owner (``nuro.protocol.adminnote``) |
"""

from __future__ import annotations

#: "Restart me from my checkpoint": the launcher's and the SDK's exit status after a stop they handled (a
#: preemption, a lost peer, a time-limit warning); the rendered batch script then requeues within its budget.
#: 75 = EX_TEMPFAIL (sysexits.h): a temporary failure, retry later.
EXIT_REQUEUE = 75

#: The signal the controller sends a preemption victim (the batch shell and every step). USR1 rather than TERM so a
#: plain TERM (scancel, time limit) still means "stop", not "checkpoint".
PREEMPT_SIGNAL = "USR1"

#: The time-limit warning the script asks Slurm for (``--signal=B:USR2@<stop_warning_s>``).
TIME_LIMIT_SIGNAL = "USR2"

#: torch.distributed's process-group timeout in the job, seconds: a worker whose peer vanished gives up after it.
PG_TIMEOUT_S = 60

#: torchrun's rendezvous port is ``RDZV_PORT_BASE + job_id % RDZV_PORT_SPAN``: two jobs sharing a node rarely
#: collide, and the script, the launcher and an operator compute the same port from the job id alone. A site (or a
#: dev cluster, whose nodes all share 127.0.0.1) moves the range with ``NURO_RDZV_PORT_BASE``/``_SPAN`` in the job's
#: environment.
RDZV_PORT_BASE = 29500
RDZV_PORT_SPAN = 1000
ENV_RDZV_PORT_BASE = "NURO_RDZV_PORT_BASE"
ENV_RDZV_PORT_SPAN = "NURO_RDZV_PORT_SPAN"

#: The most hot spare nodes one job may hold: submit refuses more (``--spare-nodes``) and so does the job's launcher
#: when it reads ``NURO_SPARE_NODES`` (``nuro.wrappers.spares``).
MAX_SPARE_NODES = 64

#: The committed checkpoints a run keeps when its record names no ``keep``: the job spec's ``checkpoint.keep``
#: default, and what root's retention (the upload worker, ``nuro.checkpoint.retention``) applies without one.
DEFAULT_CKPT_KEEP = 3

#: The job comment's one key (canonical JSON, ``nuro.protocol.jobcomment``): the run record, written at submit.
COMMENT_RUN = "nuro"
#: The admin comment's keys (``nuro.protocol.adminnote``; only root and SlurmUser may write that field): a note from
#: the platform to the job's owner. Each note replaces the field whole; none is ever read back to decide anything.
NOTE_PREEMPT = "preempt"  # the controller: the job is being preempted (for which job, why)
NOTE_REFUSED = "refused"  # root on a node (prolog, health check): why the job may not run there


def rdzv_port(job_id: int, base: int = RDZV_PORT_BASE, span: int = RDZV_PORT_SPAN) -> int:
    """The job's torchrun rendezvous port (what the batch script exports as ``NURO_RDZV_PORT``)."""
    return base + job_id % span
