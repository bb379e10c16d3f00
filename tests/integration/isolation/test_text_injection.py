"""Attack: a team member chooses job names, comments, work dirs and output paths that look like Slurm fields.

Slurm's text output never escapes values: ``scontrol show job -o`` of a job named ``x Comment={...}`` printed a second
``Comment=`` (which the old parser took), and a name with a newline printed a second ``JobId=`` record. The
controller (its preempt mark) and the prolog (``refuse``) then wrote such a made-up comment back as root; today
neither writes the job's comment at all (issue 30: root's notes go to ``admin_comment``). Here alice of perception
submits and renames her own jobs with such values (``--job-name``, ``--comment``, ``scontrol update``) and the
tests check that every read nuro makes gives the job's true fields, that root leaves the job's comment as the job
wrote it and writes only its own note, and that no record is made up. ``guard`` checks afterwards that the platform
still runs and nothing root-owned changed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from nuro.protocol import adminnote
from nuro.slurm import JobInfo, JobPhase
from nuro.slurm.parse import parse_squeue_json
from nuro.slurm_plugins.controller.apply import apply_decision
from nuro.slurm_plugins.controller.decisions import Preempt
from tests.integration.conftest import REPO, LiveCluster, wait_until
from tests.integration.isolation.conftest import ATTACKER, ATTACKER_TEAM, Guard, as_user

pytestmark = pytest.mark.slurm

#: (case, --job-name, --comment): what a member may choose. Comments are canonical nuro comments or plain text.
HOSTILE = [
    ("name_sets_comment", 'x Comment={"preempt":{"at":1},"refused":{"why":"x"}} UserId=root(0) Account=other',
     '{"run":"a"}'),
    ("name_newline_record", "a\nJobId=1 JobName=fake UserId=root(0) Account=root Comment=injected", '{"run":"b"}'),
    ("pipes_and_equals", "p|q|r x=y JobId=999", "c|d|e Account=other UserId=root(0)"),
    ("comment_sets_fields", "plain name", ' StdOut=/etc/shadow Comment={"preempt":{"at":1}} JobId=1'),
    ("comment_newline", "nl", "line1\nJobId=7 JobName=fake UserId=root(0) Account=root\n"),
    ("unit_separator", "u\x1fv\tw", "s\x1ft|x"),
]  # fmt: skip


def _sbatch(cluster: LiveCluster, name: str, comment: str, *extra: str, script: str = "sleep 300") -> int:
    res = as_user(
        cluster, ATTACKER,
        ["sbatch", "--parsable", "--nodes=1", "--ntasks=1", "--output=/dev/null", f"--job-name={name}",
         f"--comment={comment}", *extra, "--wrap", script],
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip().split(";")[0])


def _json_job(cluster: LiveCluster, job_id: int) -> JobInfo:
    """The job as ``squeue --json`` has it (escaped strings): the reference every other read is held to."""
    jobs = [j for j in parse_squeue_json(cluster.run(["squeue", "--json"]).stdout) if j.job_id == job_id]
    assert len(jobs) == 1, f"squeue --json lists job {job_id} {len(jobs)} times"
    return jobs[0]


def _assert_true_fields(cluster: LiveCluster, job_id: int, name: str, comment: str) -> None:
    backend = cluster.backend
    snap = backend.read_snapshot()
    matches = [j for j in snap.jobs if j.job_id == job_id]
    assert len(matches) == 1, f"the snapshot lists job {job_id} {len(matches)} times"
    job = matches[0]
    assert (job.name, job.comment, job.user) == (name, comment, ATTACKER)
    assert job.account == ATTACKER_TEAM  # not "other" nor "root", whatever the name says
    assert not any(j.name == "fake" for j in snap.jobs)  # the name's second "JobId=1 JobName=fake" line
    assert backend.job_comment(job_id) == comment  # what merge_comment and the prolog's refuse start from
    assert backend.job_state(job_id) == job.state
    record = backend.job_record(job_id)
    assert (record["JobName"], record["Comment"], record["Account"]) == (name, comment, ATTACKER_TEAM)
    assert record["UserId"].startswith(f"{ATTACKER}(") and record["StdOut"] == "/dev/null"


def test_hostile_names_and_comments_are_read_as_the_job_has_them(cluster: LiveCluster, guard: Guard) -> None:
    before = {j.job_id for j in cluster.backend.jobs()}
    ids = {case: _sbatch(cluster, name, comment, "--hold") for case, name, comment in HOSTILE}
    try:
        for case, name, comment in HOSTILE:
            _assert_true_fields(cluster, ids[case], name, comment)
        after = {j.job_id for j in cluster.backend.jobs()}
        assert after - before == set(ids.values())  # a newline in a name or comment made no extra job record
    finally:
        for job_id in ids.values():
            cluster.run(["scancel", str(job_id)], check=False)


def test_owner_renames_and_recomments_with_scontrol_update(cluster: LiveCluster, guard: Guard) -> None:
    job_id = _sbatch(cluster, "orig", '{"run":"c"}', "--hold")
    try:
        for _, name, comment in HOSTILE:
            res = as_user(cluster, ATTACKER, ["scontrol", "update", f"jobid={job_id}", f"name={name}",
                                              f"comment={comment}"])  # fmt: skip
            assert res.returncode == 0, res.stderr
            _assert_true_fields(cluster, job_id, name, comment)
    finally:
        cluster.run(["scancel", str(job_id)], check=False)


def test_controller_preempt_leaves_the_jobs_comment_and_notes_only_its_own(cluster: LiveCluster, guard: Guard) -> None:
    """The controller's real apply path (the owner's note in ``admin_comment``, then USR1), as root."""
    name, comment = HOSTILE[0][1], HOSTILE[0][2]
    job_id = _sbatch(cluster, name, comment)
    try:
        wait_until(lambda: cluster.backend.job_state(job_id) == "RUNNING", 90, f"job {job_id} to run")
        decision = Preempt(job_id=job_id, team=ATTACKER_TEAM, gpus=0, work_lost_gpu_s=0.0, for_job_id=4242,
                           reason="text-injection test")  # fmt: skip
        now = int(time.time())
        outcome = apply_decision(cluster.backend, decision, now)
        assert outcome.applied and "note not written" not in outcome.message, outcome.message
        assert _json_job(cluster, job_id).comment == comment  # the job's own, byte for byte: nothing from the name
        note = adminnote.parse(cluster.backend.job_admin_comment(job_id))
        assert set(note) == {"preempt"} and note["preempt"]["for"] == 4242 and note["preempt"]["at"] == now
    finally:
        cluster.run(["scancel", str(job_id)], check=False)


def test_prolog_refusal_is_recorded_in_roots_note_never_in_the_comment(cluster: LiveCluster, guard: Guard) -> None:
    """The prolog's ``refuse`` (root) writes its note to ``admin_comment`` and requeues held. A name claiming the job
    was already refused, or holding another comment, changes nothing of that, and the job's comment is untouched."""
    name, comment = HOSTILE[0][1], HOSTILE[1][2]
    job_id = _sbatch(cluster, name, comment, "--hold")
    try:
        code = "import sys; from prolog_epilog.prolog import refuse; refuse(int(sys.argv[1]), 'bad pin')"
        env = {**os.environ, **cluster.env, "SLURMD_NODENAME": "gpu001", "PYTHONPATH": str(REPO)}
        proc = subprocess.run([sys.executable, "-c", code, str(job_id)], env=env, capture_output=True, text=True,
                              timeout=60, cwd=REPO)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert _json_job(cluster, job_id).comment == comment
        note = adminnote.parse(cluster.backend.job_admin_comment(job_id))
        assert note["refused"]["why"] == "bad pin" and note["refused"]["node"] == "gpu001" and "preempt" not in note
    finally:
        cluster.run(["scancel", str(job_id)], check=False)


def test_finished_job_keeps_its_fields_and_exit_code_in_accounting(cluster: LiveCluster, guard: Guard) -> None:
    """sacct: names and comments come from JSON; the exit code from ``sacct -P`` of fields without '|'."""
    name, comment = "done|x\ny=z JobId=1", "f|g\nJobId=1 Account=other"
    job_id = _sbatch(cluster, name, comment, script="exit 3")

    def finished() -> JobInfo | None:
        records = cluster.backend.finished_jobs([job_id])
        return records[0] if records and records[0].is_finished else None

    job = wait_until(finished, 90, f"an accounting record of finished job {job_id}", interval_s=0.5)
    assert job.phase is JobPhase.FAILED and (job.exit_code, job.exit_signal) == (3, None)
    # The name as accounting has it, or "allocation": slurmdbd's placeholder for a job whose start it recorded
    # before the name (as_mysql_job.c; seen once in a full CI run, never alone). Never a value injected from the
    # name, which is the point here; the comment, user and account must be the job's own.
    assert job.name in (name, "allocation"), job.name
    assert (job.comment, job.user, job.account) == (comment, ATTACKER, ATTACKER_TEAM)
