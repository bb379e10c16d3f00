"""squeue/sinfo/sacct --json parsing, on output captured from the real dev cluster (Slurm 22.05.8).

The fixtures come from tests/fixtures/slurm/capture_fixtures.py. They hold jobs of more than one capture run
(slurmctld remembers finished jobs for MinJobAge), so jobs are looked up by name, newest id first.
"""

from __future__ import annotations

import json
from datetime import UTC
from pathlib import Path

import pytest

from nuro.slurm import JobInfo, JobPhase, SlurmParseError, SlurmUnavailable
from nuro.slurm._fields import expand_std_path
from nuro.slurm.parse import (
    merge_resized,
    parse_sacct_json,
    parse_sinfo_json,
    parse_squeue_job_record,
    parse_squeue_json,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


def newest(jobs: list[JobInfo], name: str) -> JobInfo:
    matching = [j for j in jobs if j.name == name]
    assert matching, f"no job named {name} in fixture"
    return max(matching, key=lambda j: j.job_id)


@pytest.fixture(scope="module")
def squeue_jobs() -> list[JobInfo]:
    return parse_squeue_json(read("squeue_running_pending.json"))


def test_squeue_running_gang(squeue_jobs: list[JobInfo]) -> None:
    gang = newest(squeue_jobs, "nuro-gang")
    assert gang.phase is JobPhase.RUNNING and gang.state == "RUNNING"
    assert gang.nodes == ("gpu001", "gpu002") and gang.node_count == 2
    assert gang.gres_per_node == "gres:gpu:8"
    assert (gang.gpus_per_node, gang.gpus_total) == (8, 16)
    assert json.loads(gang.comment) == {"run": "x", "team": "vision"}
    assert gang.requeue is True and gang.restart_count == 0
    assert gang.user == "root" and gang.account == "root" and gang.qos == "normal" and gang.partition == "gpu"
    assert gang.priority > 0
    assert gang.start_time is not None and gang.start_time.tzinfo is UTC
    assert gang.end_time is not None and gang.end_time > gang.start_time  # expected end: start + limit
    assert gang.exit_code is None and not gang.is_finished


def test_squeue_pending_jobs(squeue_jobs: list[JobInfo]) -> None:
    big = newest(squeue_jobs, "nuro-big")
    assert big.phase is JobPhase.PENDING and big.reason == "Resources"
    assert big.nodes == () and big.node_count == 8
    assert (big.gpus_per_node, big.gpus_total) == (8, 64)
    assert big.start_time is None and big.end_time is None and big.submit_time is not None

    held = newest(squeue_jobs, "nuro-held")
    assert held.phase is JobPhase.PENDING and held.reason == "JobHeldUser" and held.priority == 0
    assert held.gpus_per_node == 4  # --gpus-per-node=4 shows up as tres_per_node "gres:gpu:4"


def test_squeue_finished_jobs_exit_codes(squeue_jobs: list[JobInfo]) -> None:
    ok = newest(squeue_jobs, "nuro-ok")
    assert ok.phase is JobPhase.COMPLETED and (ok.exit_code, ok.exit_signal) == (0, None)
    assert json.loads(ok.comment) == {"run": "ok"} and ok.gpus_total == 0
    fail = newest(squeue_jobs, "nuro-fail")
    assert fail.phase is JobPhase.FAILED and fail.reason == "NonZeroExitCode"
    assert (fail.exit_code, fail.exit_signal) == (3, None)  # raw wait status 768
    cancel = newest(squeue_jobs, "nuro-cancel")
    assert cancel.phase is JobPhase.CANCELLED and (cancel.exit_code, cancel.exit_signal) == (None, 15)


def test_squeue_requeue_sequence() -> None:
    # Right after `scontrol requeue` the job is COMPLETING with restart 1; later RUNNING again with restart 1.
    requeued = newest(parse_squeue_json(read("squeue_requeued.json")), "nuro-small")
    assert requeued.restart_count == 1 and requeued.phase is JobPhase.COMPLETING
    restarted = newest(parse_squeue_json(read("squeue_restarted.json")), "nuro-small")
    assert restarted.restart_count == 1 and restarted.phase is JobPhase.RUNNING
    assert restarted.nodes and restarted.start_time is not None


def test_squeue_controller_down_raises_instead_of_reporting_no_jobs() -> None:
    # 22.05 exits 0 here and prints {"errors": [...], "jobs": []}.
    with pytest.raises(SlurmUnavailable, match="Unspecified error"):
        parse_squeue_json(read("squeue_controller_down.json"))


def test_squeue_garbage_is_a_parse_error() -> None:
    with pytest.raises(SlurmParseError, match="not JSON"):
        parse_squeue_json("squeue: error: something\n")
    with pytest.raises(SlurmParseError, match="no 'jobs'"):
        parse_squeue_json('{"meta": {}, "errors": []}')


def test_sinfo_nodes_and_derived_partitions() -> None:
    nodes, partitions = parse_sinfo_json(read("sinfo_8nodes.json"))
    by_name = {n.name: n for n in nodes}
    assert sorted(by_name) == [f"gpu00{i}" for i in range(1, 9)]
    gpu001 = by_name["gpu001"]
    assert gpu001.state == "MIXED" and gpu001.flags == {"MIXED"}
    assert (gpu001.gpus_total, gpu001.gpus_alloc, gpu001.gpus_free) == (8, 8, 0)
    assert by_name["gpu003"].gpus_alloc == 2 and by_name["gpu003"].gpus_free == 6
    assert by_name["gpu004"].state == "IDLE" and by_name["gpu004"].gpus_free == 8
    gpu008 = by_name["gpu008"]
    assert gpu008.state == "IDLE+DRAIN" and gpu008.reason == "nuro test"
    assert gpu008.is_drained and not gpu008.is_schedulable and gpu008.gpus_free == 0
    assert all(n.partitions == ("gpu",) and n.cpus == 16 and n.switch is None for n in nodes)
    assert {n.weight for n in nodes} == {1}  # the packing weights (controller/weights.py) are read back from here
    # 22.05's sinfo --json has no partition list: derived from the nodes.
    assert [(p.name, p.total_nodes, p.total_cpus, p.state) for p in partitions] == [("gpu", 8, 128, "UNKNOWN")]


def test_sinfo_draining_node() -> None:
    nodes, _ = parse_sinfo_json(read("sinfo_draining.json"))
    by_name = {n.name: n for n in nodes}
    assert by_name["gpu007"].state == "MIXED+DRAIN" and by_name["gpu007"].gpus_alloc == 1
    assert by_name["gpu007"].is_drained and by_name["gpu007"].reason == "nuro draining test"
    assert by_name["gpu003"].state == "IDLE+COMPLETING"


def test_sinfo_controller_down_raises() -> None:
    with pytest.raises(SlurmUnavailable):
        parse_sinfo_json(read("sinfo_controller_down.json"))


def test_sacct_finished_jobs() -> None:
    jobs = parse_sacct_json(read("sacct_finished.json"))
    assert [j.name for j in jobs] == ["nuro-ok", "nuro-fail", "nuro-cancel"]
    ok, fail, cancel = jobs
    assert ok.phase is JobPhase.COMPLETED and ok.exit_code == 0 and ok.nodes == ("gpu005",)
    assert ok.start_time is not None and ok.end_time is not None and ok.end_time.tzinfo is UTC
    # 22.05 dumps "exit 3" as {"status": "SUCCESS", "return_code": 0}: unknown, not 0.
    assert fail.phase is JobPhase.FAILED and fail.exit_code is None
    assert cancel.phase is JobPhase.CANCELLED and cancel.gpus_total == 1 and cancel.gpus_per_node == 1
    assert ok.comment == ""  # the comment only reaches slurmdbd with AccountingStoreFlags=job_comment
    assert all(j.qos == "normal" and j.account == "root" and j.user == "root" for j in jobs)


def test_sacct_nothing_found_is_empty() -> None:
    assert parse_sacct_json(read("sacct_nothing_found.json")) == []


def test_sacct_duplicates_list_each_attempt_of_a_requeued_job() -> None:
    # sacct --json -D -j 1 after `scontrol requeue 1` (captured on the dev cluster): the first run is its own
    # record (REQUEUED, with its node and times); the requeued attempt waits for its eligible time.
    attempts = parse_sacct_json(read("sacct_requeued_attempts.json"))
    assert [a.state for a in attempts] == ["REQUEUED", "RUNNING"]
    first, second = attempts
    assert first.job_id == second.job_id == 1
    assert first.nodes == ("gpu001",) and first.start_time is not None and first.end_time is not None
    assert second.submit_time is not None and second.submit_time >= first.end_time


# -- issue 11: jobs of a team member with hostile names, comments, work dirs and output paths -----------------------

HOSTILE = json.loads(read("hostile_jobs.json"))


@pytest.mark.parametrize("truth", HOSTILE["jobs"], ids=lambda t: t["case"])
def test_squeue_json_gives_the_true_fields(truth: dict) -> None:
    jobs = parse_squeue_json(read("squeue_hostile.json"))
    [job] = [j for j in jobs if j.job_id == truth["job_id"]]  # exactly one record: a newline adds none
    assert (job.name, job.comment) == (truth["name"], truth["comment"])
    assert (job.user, job.account) == (HOSTILE["user"], HOSTILE["account"])
    record = parse_squeue_job_record(read("squeue_hostile.json"), truth["job_id"])
    assert record is not None
    assert record["JobName"] == truth["name"] and record["Comment"] == truth["comment"]
    assert record["UserId"].startswith(HOSTILE["user"] + "(") and record["Account"] == HOSTILE["account"]
    assert record["WorkDir"] == truth["work_dir"]
    # "-o 'o JobId=1 %j|%x.out'" relative to the work dir, expanded as scontrol prints it
    assert record["StdOut"] == f"{truth['work_dir']}/o JobId=1 {truth['job_id']}|{truth['name']}.out"


def test_no_record_is_made_up_from_names() -> None:
    jobs = parse_squeue_json(read("squeue_hostile.json"))
    ids = [j.job_id for j in jobs]
    assert len(ids) == len(set(ids)) and not any(j.name == "fake" for j in jobs)
    assert parse_squeue_job_record(read("squeue_hostile.json"), 999999) is None


def test_sacct_json_gives_the_true_fields() -> None:
    """Accounting keeps names and comments whole too (slurmdbd stores a name's '"' as '`': its own quirk)."""
    jobs = {j.job_id: j for j in parse_sacct_json(read("sacct_hostile.json"))}
    for truth in HOSTILE["jobs"]:
        job = jobs[truth["job_id"]]
        assert job.name == truth["name"].replace('"', "`") and job.user == HOSTILE["user"]
        assert job.account == HOSTILE["account"]
    done = HOSTILE["jobs"][-1]
    assert jobs[done["job_id"]].comment == done["comment"] and jobs[done["job_id"]].phase is JobPhase.FAILED


def test_std_path_expansion_matches_scontrol() -> None:
    assert expand_std_path("", job_id=5, user="u", name="n", work_dir="/tmp") == "/tmp/slurm-5.out"
    assert expand_std_path("/o-%j-%x-%u.log", job_id=6, user="u", name="w", work_dir="/x") == "/o-6-w-u.log"
    arr = expand_std_path("", job_id=9, user="u", name="n", work_dir="/w/", array_job_id=7, array_task_id=2)
    assert arr == "/w/slurm-7_2.out"
    assert expand_std_path("a%%j %N", job_id=1, user="u", name="n", work_dir="/w") == "/w/a%j %N"


def test_a_job_that_shrank_is_one_attempt() -> None:
    # sacct --json -D -j 4 of a --no-kill job with a hot spare whose gpu006 was killed (captured on the dev cluster):
    # Slurm closed the record as RESIZING and opened another for the same attempt; no requeue.
    records = parse_sacct_json(read("sacct_resized_spare_swap.json"))
    assert [r.state for r in records] == ["RESIZING", "COMPLETED"]
    (attempt,) = merge_resized(records)
    assert attempt.state == "COMPLETED" and attempt.nodes == ("gpu005", "gpu006", "gpu007")
    assert attempt.start_time == records[0].start_time and attempt.end_time == records[1].end_time
    assert merge_resized(parse_sacct_json(read("sacct_requeued_attempts.json")))[0].state == "REQUEUED"
    # 26.05 (captured by tests/e2e/test_survive.py's spare test, job 1, gpu006 killed): PENDING+RESIZING
    records = parse_sacct_json(read("v26.05/sacct_resized_spare_swap.json"))
    assert [r.state for r in records] == ["PENDING+RESIZING", "COMPLETED"]
    (attempt,) = merge_resized(records)
    assert attempt.state == "COMPLETED" and "gpu006" in attempt.nodes and attempt.start_time == records[0].start_time


@pytest.mark.parametrize("version", ["v24.11", "v26.05"])
def test_node_weight_read_on_newer_slurm(version: str) -> None:
    """24.11+: scontrol's node JSON gives a number, sinfo's grouped record a {minimum, maximum} range."""
    for name in ("scontrol_show_node.json", "sinfo_8nodes.json"):
        nodes, _ = parse_sinfo_json(read(f"{version}/{name}"))
        assert nodes and {n.weight for n in nodes} == {1}, name
