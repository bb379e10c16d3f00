"""The adapter (make_backend → CliBackend) against the session's real cluster (gpu[001-008], leaf01/leaf02).

Changes nothing lasting: it submits one held job (never runs) and cancels it; the refused actions (unknown job,
resume of a healthy node, unknown QOS) change nothing.
"""

from __future__ import annotations

import pytest

from nuro.cluster.description import release_of
from nuro.cluster.slurmconf import OPENMETRICS_SINCE
from nuro.devcluster.layout import PortPlan
from nuro.metrics.model import SLURMCTLD, Query
from nuro.metrics.sink import sink_from_env
from nuro.slurm import (
    Backend,
    InvalidJobId,
    InvalidState,
    JobInfo,
    JobPhase,
    SubmissionRejected,
    make_backend,
)
from nuro.slurm.openmetrics import OpenMetricsError, scrape
from tests.integration.conftest import TEST_PORT_BASE, TEST_SLURM, LiveCluster, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.every_slurm]


@pytest.fixture(scope="module")
def backend(cluster: LiveCluster) -> Backend:
    return make_backend(env=cluster.env, prefer="cli", timeout_s=30)


def _accounting_record(backend: Backend, job_id: int) -> JobInfo:
    """The job's finished record from sacct (slurmdbd), not squeue: what these tests prove is the accounting path."""

    def finished() -> JobInfo | None:
        records = backend.finished_jobs([job_id])
        return records[0] if records and records[0].is_finished else None

    return wait_until(finished, 30, f"an accounting record of finished job {job_id}", interval_s=0.5)


def test_snapshot_of_the_dev_cluster(backend: Backend) -> None:
    assert backend.version().major_minor == tuple(int(part) for part in TEST_SLURM.split("."))
    snap = backend.read_snapshot()
    assert {n.name for n in snap.nodes} >= {f"gpu00{i}" for i in range(1, 9)}
    assert snap.node("gpu001").switch == "leaf01" and snap.node("gpu008").switch == "leaf02"
    assert all(n.gpus_total == 8 for n in snap.nodes)
    default = [p for p in snap.partitions if p.default]
    assert len(default) == 1 and default[0].state == "UP"


def test_each_node_has_its_own_drain_reason(backend: Backend) -> None:
    """Two idle nodes drained with different reasons read back with their own. 24.11+'s ``sinfo --json`` groups
    alike nodes and gave both the first one's reason (an admin's drain could pass for nuro's); the adapter reads
    ``scontrol --json show nodes`` there (``CliBackend.nodes_argv``)."""
    idle = [n.name for n in backend.nodes() if n.base_state == "IDLE" and not n.is_drained and not n.is_down]
    pair = idle[-2:]
    assert len(pair) == 2, idle
    reasons = {pair[0]: "adapter test one", pair[1]: "adapter test two"}
    try:
        for node, reason in reasons.items():
            assert backend.drain(node, reason).ok
        for read in (backend.nodes(), backend.read_snapshot().nodes):
            got = {n.name: n.reason for n in read if n.name in reasons}
            assert {k: (v or "").split(" [")[0] for k, v in got.items()} == reasons, got
    finally:
        for node in pair:
            backend.resume(node)


def test_submit_find_update_cancel_account(backend: Backend) -> None:
    script = "#!/bin/bash\ntrue\n"
    job_id = backend.submit(
        script, "-H", "-N1", "--gres=gpu:8", "-J", "nuro-live-test", "-o", "/dev/null", "--comment", '{"run":"live"}'
    )
    try:
        job = backend.read_snapshot().job(job_id)
        assert job is not None and job.phase is JobPhase.PENDING and job.reason == "JobHeldUser"
        assert job.gpus_per_node == 8 and job.comment == '{"run":"live"}' and job.start_time is None
        backend.update_qos(job_id, job.qos)  # same QOS: accepted, no change
    finally:
        backend.cancel(job_id)
    assert _accounting_record(backend, job_id).phase is JobPhase.CANCELLED


def test_refusals_are_classified(backend: Backend) -> None:
    with pytest.raises(InvalidJobId, match="Invalid job id specified"):
        backend.update_qos(999999, "normal")
    healthy = next(n for n in backend.nodes() if not n.is_drained and not n.is_down)
    with pytest.raises(InvalidState, match="Invalid node state (specified|transition)"):  # 26.05: "transition"
        backend.resume(healthy.name)
    with pytest.raises(SubmissionRejected, match="Invalid qos specification"):
        backend.submit("#!/bin/bash\ntrue\n", "--qos=nuro-no-such-qos", "-o", "/dev/null")
    backend.cancel(999999)  # scancel of an unknown job exits 0 on every version: cancel is idempotent


def test_a_job_that_can_never_fit_is_refused_at_submit(backend: Backend) -> None:
    """EnforcePartLimits=ALL: Slurm's own reason reaches the caller instead of a job pending forever."""
    with pytest.raises(SubmissionRejected, match="Node count specification invalid"):
        backend.submit("#!/bin/bash\ntrue\n", "--nodes=99", "-o", "/dev/null")
    with pytest.raises(SubmissionRejected, match="Requested node configuration is not available"):
        backend.submit("#!/bin/bash\ntrue\n", "--gres=gpu:9", "-o", "/dev/null")


def test_comment_survives_into_accounting(backend: Backend) -> None:
    """AccountingStoreFlags=job_comment: nuro's run metadata is still readable from sacct after the job ends."""
    comment = '{"note":"acct","x":1}'
    job_id = backend.submit("#!/bin/bash\ntrue\n", "-o", "/dev/null", f"--comment={comment}")
    record = _accounting_record(backend, job_id)
    assert record.phase is JobPhase.COMPLETED and record.comment == comment, record


def test_single_job_reads_agree_with_the_snapshot(backend: Backend) -> None:
    """job_comment / job_state / job_record (one-field squeue reads) give what squeue --json gives, for values that
    would add fields to scontrol's text (issue 11; the team-member attacks are in isolation/test_text_injection.py)."""
    name, comment = 'n Comment={"x":1}\nJobId=1 JobName=fake', "c|d Account=other\nUserId=root(0)\n"
    job_id = backend.submit(
        "#!/bin/bash\ntrue\n", "-H", "-o", "/tmp/nuro-live-%j-%x.out", "-J", name, "--comment", comment
    )
    try:
        job = backend.read_snapshot().job(job_id)
        assert job is not None and (job.name, job.comment) == (name, comment)
        assert backend.job_comment(job_id) == comment and backend.job_state(job_id) == job.state == "PENDING"
        record = backend.job_record(job_id)  # type: ignore[attr-defined]
        assert (record["JobName"], record["Comment"], record["Account"]) == (name, comment, job.account)
        assert record["StdOut"] == f"/tmp/nuro-live-{job_id}-{name}.out" and record["JobState"] == "PENDING"
        assert backend.job_restarts(job_id) == (int(record["Restarts"]), "PENDING") == (0, "PENDING")  # type: ignore[attr-defined]
    finally:
        backend.cancel(job_id)
    with pytest.raises(InvalidJobId):
        backend.job_comment(999999)


def test_slurmctld_openmetrics_reach_the_metrics_sink_where_slurm_serves_them(cluster: LiveCluster) -> None:
    """25.11+: the dev cluster's controller reads slurmctld's OpenMetrics every 10 s into the cluster's influxd
    (``slurmctld`` points, nuro.slurm.openmetrics); before 25.11 slurmctld serves none and nothing is written."""
    serves = release_of(TEST_SLURM) >= OPENMETRICS_SINCE
    base = f"http://127.0.0.1:{PortPlan(TEST_PORT_BASE).slurmctld}"
    if not serves:
        with pytest.raises(OpenMetricsError):
            scrape(base, timeout_s=5)
        return
    assert scrape(base)["gpus_total"] == 8 * 8  # slurmctld itself answers, 8 nodes x 8 GPUs
    sink = sink_from_env(cluster.env)
    try:
        rows = wait_until(lambda: sink.query(Query(SLURMCTLD, limit=1)), 30, "a slurmctld point in the sink")
    finally:
        sink.close()
    (row,) = rows
    assert row.tags == {"controller": base.removeprefix("http://")}
    assert row.fields["gpus_total"] == 64 and "jobs_pending" in row.fields and "sched_cycle_last_us" in row.fields
