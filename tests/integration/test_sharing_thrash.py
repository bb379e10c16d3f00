"""No preemption thrash on the real cluster: two teams borrow and reclaim over and over, and no job is preempted
before its current run is ``min_run_s`` old.

Perception (alice) holds its 24-GPU quota and borrows prediction's idle 16 GPUs (two whole-node jobs in
b-perception, moved there by the controller); prediction (priya) then submits jobs inside its quota, so the
controller must reclaim: it waits until the borrowers are ``min_run_s`` old, signals them, they acknowledge with
``nuro-job ack``, and they are requeued back into g-perception. Prediction's jobs are then cancelled, perception
borrows again, and the next round starts (``ROUNDS``: the number of claimants and when they come vary so that the
victims' ages differ: a borrower restarted a few seconds ago must be passed over for an older one, or waited for, and
a borrower that is old enough is still left running when one victim is enough).

Controls and simulation run their quotas with guaranteed fillers and lend nothing, so the only idle GPUs are
prediction's quota. The real ``nuro-controller`` daemon runs as a child process (JSON log, 0.5 s cycles), stopped by
PID; a background thread samples ``squeue`` every 0.5 s for the jobs' start times, QOS and states, and for the
teams' guaranteed GPUs (never above quota). The assertions compare the controller's ``decision=Preempt`` /
``decision=Requeue`` log lines with those samples: the controller logs waits (``wait_min_run``) only at debug level,
so "it waited for the minimum run time" is proven by timing.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nuro.policy import load_policy
from nuro.slurm import JobInfo, JobPhase, SlurmError
from tests.integration.conftest import (
    LiveCluster,
    apply_example_policy,
    cancel_jobs_of,
    controller_process,
    controller_progress,
    in_flight,
    wait_until,
)

pytestmark = pytest.mark.slurm

BIN = Path(sys.executable).parent
GRACE_S = 10
MIN_RUN_S = 20
BORROWER, LENDER = "perception", "prediction"
MEMBERS = {"perception": "alice", "prediction": "priya", "controls": "chen", "simulation": "sam"}
#: Rounds: (prediction's claimants, whether they wait until both borrowers are past their minimum run), each
#: starting once perception borrows 2 jobs again. Round 1: one claimant at once, borrowers started together: it waits
#: for the minimum run, and the borrower not chosen comes of age while the victim's GPUs are still being freed; it must
#: be left running. Round 2: two claimants at once, one borrower restarted seconds ago next to one past its minimum
#: run: the old one goes at once, the young one is waited for. Round 3: one claimant once both are old: one victim at
#: once, and the other (eligible all along) is left running while the victim is requeued and completes.
ROUNDS = ((1, False), (2, False), (1, True))
CLAIMS_PER_ROUND = tuple(n for n, _ in ROUNDS)
#: After a borrower's minimum run time (or its claimant's submission, whichever is later), reclaim must have
#: signalled it within this long: 0.5 s cycles plus Slurm taking a scheduling pass to give the claimant a reason.
PROMPT_S = 10.0
#: The start time of a victim's current run is read from samples up to this long after its signal: it is still
#: running then (it acks within ~1 s and is requeued on the next cycle), and a requeued job cannot start again
#: sooner than cred_expire + 1 s (6 s on the dev cluster) after its requeue.
START_LOOKAHEAD_S = 2.0

# Acknowledges a preemption request at once (as rank 0 would after committing its checkpoint), otherwise sleeps;
# takes 3 s to exit once Slurm stops it (SIGTERM; KillWait is 5 s), as a training job tearing down does, so a victim
# stays COMPLETING for a while after its requeue. Logs its starts, signals and acks (appended across restarts).
JOB = """#!/bin/bash
#SBATCH --nodes=1
say() {{ echo "$(date +%s.%N) run=${{SLURM_RESTART_COUNT:-0}} $*"; }}
on_usr1() {{ say USR1; {bin}/nuro-job ack --step 7; say "ack rc=$?"; }}
on_term() {{ say TERM; sleep 3; exit 0; }}
trap on_usr1 USR1
trap on_term TERM
say start
for i in $(seq 900); do sleep 1; done
"""


@pytest.fixture(scope="module")
def policy_file(cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/policy/teams.yaml with a short grace and minimum run, no lending hysteresis (lending follows the
    lender's demand at once, so every round borrows and reclaims), and prediction as the only lender."""

    def edit(raw: dict) -> None:
        teams = raw["teams"]
        teams[BORROWER]["borrow_limit_gpus"] = 16
        teams[LENDER]["lend_limit_gpus"] = teams[LENDER]["quota_gpus"]  # 16: all of its idle quota
        for other in ("controls", "simulation"):
            teams[other]["lend_limit_gpus"] = 0

    folder = tmp_path_factory.mktemp("policy-thrash")
    return apply_example_policy(cluster, folder, edit, grace_s=GRACE_S, min_run_s=MIN_RUN_S, lend_hysteresis_s=0)


@pytest.fixture
def clean(cluster: LiveCluster, policy_file: Path) -> Iterator[None]:
    """The test starts and ends (passed or failed) with no job of the policy's members."""
    cancel_jobs_of(cluster, tuple(MEMBERS.values()))
    try:
        yield
    finally:
        cancel_jobs_of(cluster, tuple(MEMBERS.values()))


def _submit(cluster: LiveCluster, team: str, out_dir: Path) -> int:
    """One whole-node (8 GPU) requeueable job as the team's member, in the team's default QOS g-<team>."""
    args = [f"--account={team}", f"--output={out_dir}/%j.out", "--open-mode=append", "--requeue", "--gres=gpu:8",
            "--exclusive"]  # fmt: skip
    return cluster.sbatch_as(MEMBERS[team], args, JOB.format(bin=BIN))


def controller(cluster: LiveCluster, policy_file: Path, log_path: Path) -> contextlib.AbstractContextManager:
    """The real daemon, JSON log (each line has its Unix time)."""
    return controller_process(cluster, policy_file, log_path, "--log-format", "json")


@dataclass(frozen=True)
class Seen:
    """One job in one squeue sample: ``t0``/``t1`` are the wall times just before and just after the call."""

    t0: float
    t1: float
    job_id: int
    account: str
    phase: JobPhase
    qos: str
    start: float | None
    restarts: int
    mark_at: float | None  # the controller's preemption in flight, from its ledger (whole seconds)
    ack_at: float | None  # the job's ack as the controller heard it from the node agent (whole seconds)


class Sampler(threading.Thread):
    """Every 0.5 s: the two teams' jobs (history for the timing checks) and every team's guaranteed GPUs running
    (a team above its quota in g-<team> is a violation)."""

    def __init__(self, cluster: LiveCluster, quotas: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.cluster, self.quotas = cluster, quotas
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.seen: dict[int, list[Seen]] = {}
        self.samples = 0
        self.violations: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(SlurmError):
                t0 = time.time()
                jobs = self.cluster.backend.jobs()
                t1 = time.time()
                self._record(t0, t1, jobs)
            self.stop.wait(0.5)

    def _record(self, t0: float, t1: float, jobs: list[JobInfo]) -> None:
        used: dict[str, int] = {}
        with self.lock:
            for j in jobs:
                if j.phase is JobPhase.RUNNING and j.qos == f"g-{j.account}":
                    used[j.account] = used.get(j.account, 0) + j.gpus_total
                if j.account in (BORROWER, LENDER) and not j.phase.is_terminal:
                    start = j.start_time.timestamp() if j.start_time is not None else None
                    heard = controller_progress(self.cluster, j.job_id)
                    mark_at, ack_at = in_flight(self.cluster, j.job_id), (heard.ack_at if heard else None)
                    self.seen.setdefault(j.job_id, []).append(
                        Seen(t0, t1, j.job_id, j.account, j.phase, j.qos, start, j.restart_count, mark_at, ack_at)
                    )
            for team, gpus in used.items():
                if gpus > self.quotas.get(team, 0):
                    self.violations.append(f"t={t1:.1f} {team} runs {gpus} guaranteed GPUs > quota {self.quotas[team]}")
            self.samples += 1

    def history(self, job_id: int) -> list[Seen]:
        with self.lock:
            return list(self.seen.get(job_id, ()))


@pytest.fixture
def sampler(cluster: LiveCluster, policy_file: Path) -> Iterator[Sampler]:
    s = Sampler(cluster, {t.name: t.quota_gpus for t in load_policy(policy_file).teams})
    s.start()
    try:
        yield s
    finally:
        s.stop.set()
        s.join(10)
    assert s.samples > 0 and not s.violations, s.violations[:5]


@dataclass(frozen=True)
class Logged:
    """One ``decision=…`` line of the controller's log."""

    ts: float
    kind: str
    job_id: int
    applied: bool
    code: str
    reason: str
    result: str

    @property
    def for_job(self) -> int | None:
        """The claimant a Preempt was for (its reason says "… job <id> needs …")."""
        m = re.search(r"job (\d+) needs", self.reason)
        return int(m.group(1)) if m else None


_DECISION = re.compile(r"decision=(\w+) job=(\d+) applied=(True|False) code=(\S+) reason=(.*)$")


def _decisions(log_path: Path) -> list[Logged]:
    out = []
    for line in log_path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        m = _DECISION.search(rec.get("msg", ""))
        if m is None:
            continue
        reason, _, result = m.group(5).rpartition(" result=")
        out.append(Logged(float(rec["ts"]), m.group(1), int(m.group(2)), m.group(3) == "True", m.group(4),
                          reason, result))  # fmt: skip
    return out


def _now_jobs(cluster: LiveCluster, team: str) -> list[JobInfo]:
    return [j for j in cluster.backend.jobs() if j.account == team and not j.phase.is_terminal]


def _borrowing(cluster: LiveCluster, n: int) -> list[JobInfo] | None:
    """Perception's borrowed jobs when exactly ``n`` run in b-perception and none of its jobs waits."""
    jobs = _now_jobs(cluster, BORROWER)
    running = [j for j in jobs if j.phase is JobPhase.RUNNING and j.qos == f"b-{BORROWER}"]
    waiting = [j for j in jobs if j.phase is not JobPhase.RUNNING]
    return running if len(running) == n and not waiting else None


def _start_when_signalled(history: list[Seen], ts: float) -> float | None:
    """The start of the run a job was in when signalled at ``ts`` (see ``START_LOOKAHEAD_S``)."""
    starts = [s.start for s in history if s.phase is JobPhase.RUNNING and s.start and s.t1 <= ts + START_LOOKAHEAD_S]
    return max(starts, default=None)


def _timeline(sampler: Sampler, decisions: list[Logged], job_ids: set[int], out_dir: Path) -> str:
    """What to read when a check fails: the decisions, each job's runs (start, QOS) as sampled, and what the jobs
    logged (starts, preemption signals, acks)."""
    lines = ["decisions:"]
    for d in decisions:
        claimant = f" for={d.for_job}" if d.kind == "Preempt" else ""
        lines.append(f"  {d.ts:.1f} {d.kind} job={d.job_id}{claimant} applied={d.applied} {d.code} {d.result}")
    lines.append("runs:")
    for job_id in sorted(job_ids):
        prev = None
        for s in sampler.history(job_id):
            key = (s.phase, s.qos, s.start, s.mark_at, s.ack_at)
            if key != prev:
                lines.append(f"  {s.t0:.1f} job={job_id} {s.phase} {s.qos} start={s.start} restarts={s.restarts} "
                             f"mark_at={s.mark_at} ack_at={s.ack_at}")  # fmt: skip
                prev = key
    lines.append("job output:")
    for job_id in sorted(job_ids):
        out = out_dir / f"{job_id}.out"
        lines += [f"  {job_id}: {line}" for line in (out.read_text().splitlines() if out.exists() else ["(none)"])]
    return "\n".join(lines)


def test_borrow_reclaim_rounds_never_preempt_inside_min_run(
    cluster: LiveCluster, clean: None, sampler: Sampler, policy_file: Path, tmp_path: Path, shared_tmp: Path
) -> None:
    """Checks, from the controller's log and the samples: (1) every victim's current run was ``min_run_s`` old at its
    signal (so none is preempted twice within it) and its claimant was pending until then; (2) one victim per
    claimant, only borrowers, every round; (3) each victim was requeued into g-perception, stayed there while pending,
    and was requeued on its ack, not at grace end; (4) no team above its quota in g- (the sampler fixture)."""
    log_path = tmp_path / "controller.log"
    out = shared_tmp / "jobs"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    submitted: dict[int, float] = {}  # claimant -> submission time
    with controller(cluster, policy_file, log_path):
        fillers = [_submit(cluster, t, out) for t in ("controls", "simulation", "simulation")]
        for job_id in fillers:
            cluster.backend.wait_for_job(job_id, {JobPhase.RUNNING}, timeout_s=40)
        guaranteed = [_submit(cluster, BORROWER, out) for _ in range(3)]
        for job_id in guaranteed:
            cluster.backend.wait_for_job(job_id, {JobPhase.RUNNING}, timeout_s=40)
        borrowers = {_submit(cluster, BORROWER, out), _submit(cluster, BORROWER, out)}
        for n_claims, late in ROUNDS:
            running = wait_until(
                lambda: _borrowing(cluster, 2), 60, "perception to borrow prediction's 16 idle GPUs (2 jobs in b-)"
            )
            assert {j.job_id for j in running} == borrowers, running
            if late:
                youngest = max(j.start_time.timestamp() for j in running if j.start_time is not None)
                time.sleep(max(0.0, youngest + MIN_RUN_S + 2 - time.time()))
            claimants = []
            for _ in range(n_claims):
                claimants.append(_submit(cluster, LENDER, out))
                submitted[claimants[-1]] = time.time()
            for job_id in claimants:
                cluster.backend.wait_for_job(job_id, {JobPhase.RUNNING}, timeout_s=MIN_RUN_S + GRACE_S + 30)
            # The reclaimed borrowers wait in g-perception (perception is at its quota: Slurm holds them), not b-
            requeued = wait_until(
                lambda n=n_claims: (
                    len(p := [j for j in _now_jobs(cluster, BORROWER) if j.phase is JobPhase.PENDING]) == n and p
                ),
                30,
                f"{n_claims} of perception's borrowers to be requeued",
            )
            time.sleep(1)  # a few controller cycles: nothing moves them back to b- while prediction holds its GPUs
            for job in requeued:
                now = next(j for j in _now_jobs(cluster, BORROWER) if j.job_id == job.job_id)
                assert now.phase is JobPhase.PENDING and now.qos == f"g-{BORROWER}", now
                assert now.restart_count >= 1, now
            cancel = cluster.run(["scancel", *map(str, claimants)], check=False)
            assert cancel.returncode == 0, cancel.stderr
        wait_until(lambda: _borrowing(cluster, 2), 60, "perception to borrow again after the last round")

    decisions = [d for d in _decisions(log_path) if d.job_id in borrowers | set(submitted)]
    why = _timeline(sampler, decisions, borrowers | set(submitted), out)
    preempts = [d for d in decisions if d.kind == "Preempt"]
    requeues = [d for d in decisions if d.kind == "Requeue"]
    assert all(d.applied for d in preempts + requeues), why
    # (2) the scenario reclaimed every round: one victim per claimant (a second one would be a needless preemption),
    # only borrowers
    assert {d.job_id for d in preempts} <= borrowers, why
    victims_of = {c: [(d.job_id, round(d.ts - submitted[c], 1)) for d in preempts if d.for_job == c] for c in submitted}
    extra = {c: v for c, v in victims_of.items() if len(v) > 1}
    assert not extra, f"claimants with more than one victim (job, s after the claimant's submission): {extra}\n{why}"
    assert all(victims_of.values()) and len(preempts) == sum(CLAIMS_PER_ROUND) >= 2, why
    waited = 0
    for p in preempts:
        history = sampler.history(p.job_id)
        start = _start_when_signalled(history, p.ts)
        assert start is not None, f"no running sample of victim {p.job_id} before its signal\n{why}"
        # (1) the victim's current run was min_run_s old when signalled
        assert p.ts - start >= MIN_RUN_S, f"job {p.job_id} signalled {p.ts - start:.1f} s into its run\n{why}"
        # it was a borrower then, not a guaranteed job
        at_signal = [s for s in history if s.t1 <= p.ts and s.start == start]
        assert at_signal and at_signal[-1].qos == f"b-{BORROWER}", why
        # the claimant waited (pending) until then, and reclaim acted promptly once the victim was old enough
        claimant = p.for_job
        assert claimant is not None
        ran_before = [s for s in sampler.history(claimant) if s.phase is JobPhase.RUNNING and s.t1 < p.ts]
        assert not ran_before, f"claimant {claimant} ran before its victim {p.job_id} was signalled\n{why}"
        due = max(start + MIN_RUN_S, submitted[claimant])
        assert p.ts - due <= PROMPT_S, f"job {p.job_id} signalled {p.ts - due:.1f} s after it was due\n{why}"
        if submitted[claimant] < start + MIN_RUN_S:
            waited += 1  # the claimant arrived while its victim was young: reclaim waited for the minimum run
    assert waited >= 2, f"only {waited} preemption(s) had to wait for the minimum run time\n{why}"
    # no job preempted twice within its minimum run time (nor twice in one run)
    for job_id in borrowers:
        times = sorted(p.ts for p in preempts if p.job_id == job_id)
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        assert all(g >= MIN_RUN_S for g in gaps), f"job {job_id} preempted {gaps} s apart\n{why}"
    # (3) every victim was requeued into g-perception and stayed there while pending until lent GPUs again
    for p in preempts:
        rq = next((r for r in requeues if r.job_id == p.job_id and r.ts > p.ts), None)
        assert rq is not None and f"qos -> g-{BORROWER}" in rq.result, f"no requeue of {p.job_id} into g-\n{why}"
        lent_again = next((d.ts for d in decisions if d.kind == "Borrow" and d.job_id == p.job_id and d.ts > rq.ts),
                          float("inf"))  # fmt: skip
        pending = [
            s for s in sampler.history(p.job_id) if s.phase is JobPhase.PENDING and rq.ts < s.t0 and s.t1 < lent_again
        ]
        assert pending, f"no pending sample of {p.job_id} between its requeue and its next borrow\n{why}"
        assert all(s.qos == f"g-{BORROWER}" for s in pending), f"requeued {p.job_id} pending in b-\n{why}"
    # ... and each victim's ack (its jobs ack within a second of the signal) requeued it at once, not at grace end
    for p in preempts:
        rq = next(r for r in requeues if r.job_id == p.job_id and r.ts > p.ts)
        acks = {s.ack_at for s in sampler.history(p.job_id) if p.ts - 5 <= s.t0 <= rq.ts and s.ack_at}
        assert rq.code == "requeue_acked", (
            f"job {p.job_id} signalled at {p.ts:.3f} acked at {sorted(acks)} (whole seconds, as its comment holds the "
            f"ack), yet was requeued {rq.ts - p.ts:.1f} s later at grace end:\n{why}"
        )
