"""One typed snapshot from every supported Slurm version: the parsers read real output of 22.05, 24.11 and 26.05.

The fixtures are captured, never written by hand: tests/fixtures/slurm/ (22.05, ``capture_fixtures.py``) and
tests/fixtures/slurm/v24.11, v26.05 (``capture_versions.py``, small clusters in debootstrap root filesystems). The same
scenario ran on each: ``nuro-gang`` (2 nodes × 8 GPUs, running, JSON comment), ``nuro-small`` (1 GPU; requeued
once), ``nuro-big`` (pending on resources), ``nuro-held``, ``nuro-ok``, ``nuro-fail`` (exit 3), ``nuro-cancel``, a
drained node. Job ids differ per capture: jobs are found by name.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nuro.slurm import JobInfo, JobPhase
from nuro.slurm.parse import (
    newest_data_parser,
    parse_per_job_errors,
    parse_sacct_exitcodes,
    parse_sacct_json,
    parse_scontrol_partitions,
    parse_scontrol_show_topology,
    parse_sinfo_json,
    parse_sprio_site_factors,
    parse_squeue_json,
    parse_version,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
NEWER = ("24.11", "26.05")


def _read(version: str, name: str) -> str:
    return (FIXTURES / f"v{version}" / name).read_text()


def _by_name(jobs: list[JobInfo], name: str) -> JobInfo:
    return next(j for j in jobs if j.name == name)


@pytest.mark.parametrize("version", NEWER)
def test_the_version_is_read_from_sinfo(version: str) -> None:
    assert parse_version(_read(version, "sinfo_version.txt")).major_minor == tuple(int(x) for x in version.split("."))


@pytest.mark.parametrize("version", NEWER)
def test_squeue_jobs_read_as_on_22_05(version: str) -> None:
    jobs = parse_squeue_json(_read(version, "squeue_running_pending.json"))
    gang = _by_name(jobs, "nuro-gang")
    assert gang.phase is JobPhase.RUNNING and gang.nodes == ("gpu001", "gpu002") and gang.node_count == 2
    assert gang.gpus_per_node == 8 and gang.gpus_total == 16 and gang.requeue
    assert gang.comment == '{"run":"x","team":"vision"}' and gang.start_time is not None and gang.exit_code is None
    small = _by_name(jobs, "nuro-small")
    assert small.phase is JobPhase.RUNNING and small.gpus_total == 1 and small.restart_count == 0
    big = _by_name(jobs, "nuro-big")
    assert big.phase is JobPhase.PENDING and big.reason == "Resources" and big.gpus_per_node == 8
    assert big.start_time is None and big.end_time is None  # pending: leftovers dropped, as on 22.05
    held = _by_name(jobs, "nuro-held")
    assert held.phase is JobPhase.PENDING and held.reason == "JobHeldUser"


@pytest.mark.parametrize("version", NEWER)
def test_ended_jobs_exit_codes_from_squeue_all_states(version: str) -> None:
    """24.11+'s squeue lists ended jobs only with ``-t all``; their ``exit_code`` is a dict, not 22.05's wait status."""
    jobs = parse_squeue_json(_read(version, "squeue_all_states.json"))
    ok, fail = _by_name(jobs, "nuro-ok"), _by_name(jobs, "nuro-fail")
    assert ok.phase is JobPhase.COMPLETED and (ok.exit_code, ok.exit_signal) == (0, None)
    assert fail.phase is JobPhase.FAILED and (fail.exit_code, fail.exit_signal) == (3, None)
    cancel = _by_name(jobs, "nuro-cancel")
    # scancel's TERM, as the capture raced: ["ERROR"] with 143 when the batch shell exited 128 + 15 first (24.11's
    # file), ["SIGNALED"] with signal 15 when it was killed first (26.05's): either is read as given
    assert cancel.phase is JobPhase.CANCELLED
    assert (cancel.exit_code, cancel.exit_signal) in {(143, None), (None, 15)}


@pytest.mark.parametrize("version", NEWER)
def test_a_requeued_job_still_completing_holds_its_node_then_runs_again(version: str) -> None:
    requeued = _by_name(parse_squeue_json(_read(version, "squeue_requeued.json")), "nuro-small")
    assert requeued.state == "PENDING+COMPLETING" and requeued.phase is JobPhase.COMPLETING  # 22.05: "COMPLETING"
    assert requeued.phase.holds_resources and requeued.restart_count == 1
    again = _by_name(parse_squeue_json(_read(version, "squeue_restarted.json")), "nuro-small")
    assert again.phase is JobPhase.RUNNING and again.restart_count == 1


@pytest.mark.parametrize("version", NEWER)
def test_scontrol_show_job_json_has_squeues_shape(version: str) -> None:
    jobs = parse_squeue_json(_read(version, "scontrol_show_job.json"))
    assert {"nuro-gang", "nuro-small", "nuro-big", "nuro-ok", "nuro-fail"} <= {j.name for j in jobs}
    assert _by_name(jobs, "nuro-fail").exit_code == 3


@pytest.mark.parametrize("version", NEWER)
@pytest.mark.parametrize("name", ["sinfo_8nodes.json", "sinfo_nodes_N.json"])
def test_sinfo_records_of_alike_nodes_become_one_node_each(version: str, name: str) -> None:
    nodes, partitions = parse_sinfo_json(_read(version, name))
    by = {n.name: n for n in nodes}
    assert sorted(by) == ["gpu001", "gpu002", "gpu003", "gpu004"]
    assert all(n.gpus_total == 8 and n.cpus == 16 and n.partitions == ("gpu",) for n in nodes)
    assert by["gpu001"].gpus_alloc == by["gpu002"].gpus_alloc == 8 and by["gpu003"].gpus_alloc == 1
    assert by["gpu004"].state == "IDLE+DRAIN" and by["gpu004"].is_drained and by["gpu004"].reason == "nuro test"
    assert [(p.name, len(p.nodes)) for p in partitions] == [("gpu", 4)]


@pytest.mark.parametrize("version", NEWER)
def test_a_draining_node(version: str) -> None:
    by = {n.name: n for n in parse_sinfo_json(_read(version, "sinfo_draining.json"))[0]}
    assert by["gpu004"].state == "MIXED+DRAIN" and by["gpu004"].reason == "nuro draining test"


@pytest.mark.parametrize("version", NEWER)
def test_sacct_exit_codes_are_right_on_newer_versions(version: str) -> None:
    """22.05's sacct JSON said SUCCESS for ``exit 3`` (the text fallback fixes it); 24.11+ say ERROR with 3."""
    jobs = parse_sacct_json(_read(version, "sacct_finished.json"))
    assert (_by_name(jobs, "nuro-ok").exit_code, _by_name(jobs, "nuro-fail").exit_code) == (0, 3)
    assert _by_name(jobs, "nuro-ok").comment == '{"run":"ok"}'
    assert sorted(parse_sacct_exitcodes(_read(version, "sacct_exitcodes.txt")).values()) == [
        (0, None),
        (0, None),
        (3, None),
    ]
    attempts = parse_sacct_json(_read(version, "sacct_requeued_attempts.json"))
    assert {j.phase for j in attempts if j.name == "nuro-small"} >= {JobPhase.PENDING}  # ["PENDING", "REQUEUED"]


@pytest.mark.parametrize("version", NEWER)
def test_text_outputs_unchanged(version: str) -> None:
    assert sorted(parse_sprio_site_factors(_read(version, "sprio_site_factors.txt")).values()) == [0, 5000]
    refused = parse_per_job_errors(_read(version, "scontrol_update_list_stderr.txt"))
    assert sorted(refused.values()) == ["Invalid job id specified", "Job has already finished"]
    parts = parse_scontrol_partitions(_read(version, "scontrol_show_partition_oneliner.txt"))
    assert [(p.name, p.state, p.default, len(p.nodes)) for p in parts] == [("gpu", "UP", True, 4)]
    assert parse_scontrol_show_topology(_read(version, "scontrol_show_topology.txt")) == {
        "gpu001": "leaf01",
        "gpu002": "leaf01",
        "gpu003": "leaf02",
        "gpu004": "leaf02",
    }


def test_the_complex_json_reads_into_the_same_jobs() -> None:
    """26.05: the bulk read's ``--json=v0.0.45+complex`` (plain numbers, "Infinity", nulls) and the default output
    of the same three held jobs parse into equal jobs."""
    plain = parse_squeue_json(_read("26.05", "squeue_held_plain.json"))
    complex_ = parse_squeue_json(_read("26.05", "squeue_held_complex.json"))
    assert [j.job_id for j in plain] == [1, 2, 3]
    assert complex_ == plain
    assert all(j.phase == JobPhase.PENDING for j in plain)
    assert '"Infinity"' in _read("26.05", "squeue_held_complex.json")  # the case as_int must survive


def test_the_newest_data_parser_is_chosen_from_the_list() -> None:
    listed = "data_parser/v0.0.42\ndata_parser/v0.0.40\ndata_parser/v0.0.41\n"  # 24.11.5's stdout, verbatim
    assert newest_data_parser(listed) == "v0.0.42"
    assert newest_data_parser("data_parser/v0.0.9\ndata_parser/v0.0.45\n") == "v0.0.45"
    assert newest_data_parser("") is None
    assert newest_data_parser("squeue: unrecognized option '--json=list'") is None


@pytest.mark.parametrize("text", ["Infinity", "infinite", "-Infinity", "NaN"])
def test_an_infinite_number_of_the_complex_output_is_the_default(text: str) -> None:
    from nuro.slurm._fields import as_int

    assert as_int(text, default=7) == 7
    assert as_int(1e400, default=7) == 7  # float("inf") from a JSON 1e400: never an OverflowError
