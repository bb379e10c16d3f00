"""CliBackend end to end against fake Slurm commands that replay output captured from the real cluster.

The fake commands are real executables in a temp bin_dir, so the subprocess path (argv lists, env, stdin, cwd,
timeouts, exit codes) is exercised for real; only slurmctld's answers are replayed from fixtures.
"""

from __future__ import annotations

import json
import logging
import stat
import sys
from pathlib import Path

import pytest

from nuro.slurm import (
    CliBackend,
    InvalidJobId,
    InvalidState,
    JobPhase,
    SlurmCommandNotFound,
    SlurmConfigMissing,
    SlurmTimeout,
    SlurmUnavailable,
    SubmissionRejected,
    Submit,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
ERRORS = {c["name"]: c for c in json.loads((FIXTURES / "slurm_errors.json").read_text())}
COMMANDS = ("squeue", "sinfo", "scontrol", "sacct", "sbatch", "scancel")

FAKE = """#!{python}
import json, os, sys, time
argv = [os.path.basename(sys.argv[0])] + sys.argv[1:]
stdin = sys.stdin.read()
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps({{"argv": argv, "stdin": stdin, "cwd": os.getcwd(),
                          "slurm_conf": os.environ.get("SLURM_CONF")}}) + "\\n")
key = " ".join(argv)
for prefix, resp in json.load(open(os.environ["FAKE_TABLE"])):
    if key.startswith(prefix):
        time.sleep(resp.get("sleep", 0))
        if resp.get("file"):
            sys.stdout.write(open(os.path.join(os.environ["FAKE_FIXTURES"], resp["file"])).read())
        sys.stdout.write(resp.get("stdout", ""))
        sys.stderr.write(resp.get("stderr", ""))
        sys.exit(resp.get("rc", 0))
sys.stderr.write("fake slurm: no response for " + key + "\\n")
sys.exit(99)
"""


class FakeSlurm:
    """A bin_dir of fake Slurm commands answering from a prefix → response table."""

    def __init__(self, root: Path) -> None:
        self.bin = root / "bin"
        self.bin.mkdir()
        self.log = root / "calls.jsonl"
        self.table_path = root / "table.json"
        self.conf = root / "slurm.conf"  # the backend checks that SLURM_CONF exists; the fakes never read it
        self.conf.write_text("ClusterName=fake\n")
        self.table: list[list[object]] = []
        for name in COMMANDS:
            path = self.bin / name
            path.write_text(FAKE.format(python=sys.executable))
            path.chmod(path.stat().st_mode | stat.S_IXUSR)

    def on(self, prefix: str, **resp: object) -> FakeSlurm:
        self.table.append([prefix, resp])
        self.table_path.write_text(json.dumps(self.table))
        return self

    def backend(self, timeout_s: float = 10.0) -> CliBackend:
        env = {
            "FAKE_LOG": str(self.log),
            "FAKE_TABLE": str(self.table_path),
            "FAKE_FIXTURES": str(FIXTURES),
            "SLURM_CONF": str(self.conf),
        }
        return CliBackend(env=env, timeout_s=timeout_s, bin_dir=str(self.bin))

    def calls(self) -> list[dict[str, object]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def argvs(self) -> list[list[str]]:
        return [c["argv"] for c in self.calls()]  # type: ignore[misc]


@pytest.fixture
def fake(tmp_path: Path) -> FakeSlurm:
    return (
        FakeSlurm(tmp_path)
        .on("squeue --json", file="squeue_running_pending.json")
        .on("sinfo --json", file="sinfo_8nodes.json")
        .on("sinfo --version", file="sinfo_version.txt")
        .on("scontrol show -o partition", file="scontrol_show_partition_oneliner.txt")
        .on("scontrol show topology", file="scontrol_show_topology.txt")
    )


def test_snapshot_from_real_outputs(fake: FakeSlurm, caplog: pytest.LogCaptureFixture) -> None:
    backend = fake.backend()
    with caplog.at_level(logging.DEBUG, logger="nuro.slurm.cli_runner"):
        snap = backend.read_snapshot()
        backend.read_snapshot()
    gang = max((j for j in snap.jobs if j.name == "nuro-gang"), key=lambda j: j.job_id)
    assert snap.job(gang.job_id) == gang and snap.job(str(gang.job_id)) == gang and snap.job(999999) is None
    assert gang.phase is JobPhase.RUNNING
    assert snap.node("gpu001").switch == "leaf01" and snap.node("gpu008").switch == "leaf02"
    assert snap.node("gpu008").is_drained and snap.node("nope") is None
    assert snap.partition("gpu").default and snap.partition("gpu").state == "UP"
    assert snap.gpus_total == 64 and snap.taken_at.tzinfo is not None and snap.source == "cli"
    # topology is read once per backend; squeue/sinfo once per snapshot, partitions at most every 30 s (admin
    # configuration); argv are lists, no shell
    argvs = fake.argvs()
    assert argvs.count(["scontrol", "show", "topology"]) == 1
    assert argvs.count(["squeue", "--json", "-t", "all"]) == 2 and argvs.count(["sinfo", "--json"]) == 2
    assert argvs.count(["scontrol", "show", "-o", "partition"]) == 1
    assert backend.partitions([], max_age_s=0.0) == list(snap.partitions)  # an explicit read always asks again
    assert fake.argvs().count(["scontrol", "show", "-o", "partition"]) == 2
    assert all(c["slurm_conf"] == str(fake.conf) for c in fake.calls())
    assert any("argv=" in r.getMessage() and "squeue --json" in r.getMessage() for r in caplog.records)
    backend.refresh_topology()
    backend.nodes()
    assert fake.argvs().count(["scontrol", "show", "topology"]) == 2


def test_snapshot_raises_when_controller_down(tmp_path: Path) -> None:
    fake = FakeSlurm(tmp_path).on("squeue --json", file="squeue_controller_down.json")
    with pytest.raises(SlurmUnavailable):
        fake.backend().read_snapshot()


def test_squeue_without_json_falls_back_to_format(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fake = (
        FakeSlurm(tmp_path)
        .on("squeue --json", rc=1, stderr="squeue: unrecognized option '--json'\nTry \"squeue --help\"\n")
        .on("squeue -h -a -t all -o", file="squeue_format_fallback.txt")
    )
    backend = fake.backend()
    with caplog.at_level(logging.WARNING):
        jobs = backend.jobs()
        backend.jobs()
    done_id = json.loads((FIXTURES / "hostile_jobs.json").read_text())["jobs"][-1]["job_id"]
    done = next(j for j in jobs if j.job_id == done_id)  # the hostile capture's finished job ("done|x\ny=z")
    assert done.phase is JobPhase.FAILED and done.user == "nuro-alice" and done.nodes == ("gpu001",)
    assert all(j.name == "" and j.comment == "" for j in jobs)  # free text is never read from squeue -o
    assert fake.argvs().count(["squeue", "--json", "-t", "all"]) == 1  # the fallback sticks
    assert sum("no --json" in r.getMessage() for r in caplog.records) == 1


def test_submit_sends_script_on_stdin(fake: FakeSlurm, tmp_path: Path) -> None:
    fake.on("sbatch --parsable", file="sbatch_parsable.txt")
    backend = fake.backend()
    script = "#!/bin/bash\nsrun hostname\n"
    job_id = backend.submit(script, "-N2", "--gres=gpu:8", cwd=str(tmp_path))
    assert job_id == int((FIXTURES / "sbatch_parsable.txt").read_text().split(";")[0])
    call = fake.calls()[-1]
    assert call["argv"] == ["sbatch", "--parsable", f"--chdir={tmp_path}", "-N2", "--gres=gpu:8"]
    assert call["stdin"] == script and call["cwd"] == str(tmp_path)


def test_rejected_submission(tmp_path: Path) -> None:
    case = ERRORS["sbatch_bad_qos"]
    fake = FakeSlurm(tmp_path).on("sbatch", rc=case["rc"], stderr=case["stderr"])
    backend = fake.backend()
    result = backend.apply(Submit("#!/bin/bash\ntrue\n", ("--qos=nosuchqos",)))
    assert not result.ok and isinstance(result.error, SubmissionRejected)
    assert result.message == case["stderr"].strip() and result.job_id is None and result.duration_s >= 0
    with pytest.raises(SubmissionRejected, match="Invalid qos specification"):
        backend.submit("#!/bin/bash\ntrue\n", "--qos=nosuchqos")


def test_resume_of_a_node_that_is_not_drained(tmp_path: Path) -> None:
    case = ERRORS["resume_not_drained"]
    fake = FakeSlurm(tmp_path).on("scontrol update", rc=case["rc"], stderr=case["stderr"])
    with pytest.raises(InvalidState, match="Invalid node state specified"):
        fake.backend().resume("gpu001")
    assert fake.argvs() == [["scontrol", "update", "nodename=gpu001", "state=resume"]]


def test_finished_jobs_fills_exit_codes_lost_by_sacct_json(tmp_path: Path) -> None:
    fake = (
        FakeSlurm(tmp_path)
        .on("sacct --json", file="sacct_finished.json")
        .on("sacct -n -P -X", file="sacct_exitcodes.txt")
    )
    ids = [json.loads((FIXTURES / "sacct_finished.json").read_text())["jobs"][i]["job_id"] for i in (2, 0, 1)]
    jobs = fake.backend().finished_jobs([*ids, ids[0]])
    assert [j.job_id for j in jobs] == ids  # order asked for, duplicates dropped
    by_name = {j.name: j for j in jobs}
    assert by_name["nuro-fail"].exit_code == 3 and by_name["nuro-ok"].exit_code == 0
    argvs = fake.argvs()
    assert argvs[0] == ["sacct", "--json", "-D", "-j", ",".join(str(i) for i in ids)]
    assert len(argvs) == 2 and argvs[1][:7] == [
        "sacct",
        "-n",
        "-P",
        "-X",
        "-o",
        "JobIDRaw,ExitCode,State",
        "-j",
    ]
    assert fake.backend().finished_jobs([]) == []


@pytest.mark.parametrize(
    ("capture", "job_id", "state", "restarts"),
    [
        ("sacct_requeued_attempts.json", 1, "RUNNING", 1),  # requeued once: two attempts
        ("sacct_resized_spare_swap.json", 4, "COMPLETED", 0),  # a hot spare's resize record is no restart
    ],
)
def test_finished_jobs_count_the_attempts_sacct_keeps_no_restart_count_for(
    tmp_path: Path, capture: str, job_id: int, state: str, restarts: int
) -> None:
    """Accounting keeps no restart count: a requeued job slurmctld had forgotten read as "0 restarts" in lineage."""
    (job,) = FakeSlurm(tmp_path).on("sacct --json", file=capture).backend().finished_jobs([job_id])
    assert (job.job_id, job.state, job.restart_count) == (job_id, state, restarts)


def test_version_is_read_once(fake: FakeSlurm) -> None:
    backend = fake.backend()
    assert str(backend.version()) == "22.05.8" and str(backend.version()) == "22.05.8"
    assert fake.argvs().count(["sinfo", "--version"]) == 1


def test_topology_failure_leaves_switch_unknown(tmp_path: Path) -> None:
    fake = (
        FakeSlurm(tmp_path)
        .on("sinfo --json", file="sinfo_8nodes.json")
        .on("scontrol show topology", rc=1, stderr="scontrol: error: topology/none\n")
    )
    assert all(n.switch is None for n in fake.backend().nodes())


def test_timeout(tmp_path: Path) -> None:
    fake = FakeSlurm(tmp_path).on("squeue", sleep=5)
    with pytest.raises(SlurmTimeout, match="timeout_s=0.5"):
        fake.backend(timeout_s=0.5).jobs()


def test_call_timeout_limits_this_threads_calls_only(tmp_path: Path) -> None:
    import threading

    fake = FakeSlurm(tmp_path).on("squeue --json", sleep=1.5, file="squeue_running_pending.json")
    backend = fake.backend(timeout_s=10)
    other: list[object] = []
    with backend.call_timeout(0.5):
        # another thread of the daemon (failure detector, snapshot) keeps the backend's own limit
        t = threading.Thread(target=lambda: other.append(backend.jobs() is not None))
        t.start()
        with pytest.raises(SlurmTimeout, match="timeout_s=0.5"):
            backend.jobs()
        # an inner block can only shorten the limit, never lengthen it
        with backend.call_timeout(30), pytest.raises(SlurmTimeout, match="timeout_s=0.5"):
            backend.jobs()
        t.join(10)
    assert other == [True]
    assert backend.jobs() is not None  # after the block: the backend's own limit again


def test_command_not_found(tmp_path: Path) -> None:
    backend = CliBackend(bin_dir=str(tmp_path))
    with pytest.raises(SlurmCommandNotFound, match="bin_dir"):
        backend.version()
    result = backend.apply(Submit("#!/bin/bash\ntrue\n"))
    assert not result.ok and isinstance(result.error, SlurmCommandNotFound)


def test_missing_slurm_conf_fails_at_once_without_running_anything(tmp_path: Path) -> None:
    """scontrol retries a missing slurm.conf for 60 s; the backend says what is wrong before that."""
    fake = FakeSlurm(tmp_path).on("squeue", stdout="{}")
    backend = CliBackend(env={"SLURM_CONF": str(tmp_path / "nope.conf")}, bin_dir=str(fake.bin))
    with pytest.raises(SlurmConfigMissing, match=r"SLURM_CONF=.*nope.conf does not exist.*Point SLURM_CONF"):
        backend.jobs()
    assert not fake.log.exists()  # nothing ran


def test_invalid_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        CliBackend(timeout_s=0)


HOSTILE = json.loads((FIXTURES / "hostile_jobs.json").read_text())["jobs"]
ONE_FIELD_READS = json.loads((FIXTURES / "squeue_one_field_hostile.json").read_text())


def _replaying(tmp_path: Path, job_id: int) -> FakeSlurm:
    fake = FakeSlurm(tmp_path)
    for read in ONE_FIELD_READS:
        if read["job_id"] == job_id:
            fake.on(" ".join(read["argv"]), stdout=read["stdout"])
    return fake


@pytest.mark.parametrize("truth", HOSTILE, ids=lambda t: t["case"])
def test_job_comment_and_record_are_the_jobs_own(tmp_path: Path, truth: dict) -> None:
    """Issue 11: the comment the controller and the prolog merge into is the job's own, whatever its name says."""
    job_id = truth["job_id"]
    fake = _replaying(tmp_path, job_id)
    backend = fake.backend()
    assert backend.job_comment(job_id) == truth["comment"]
    assert fake.argvs()[0] == ["squeue", "-h", "-t", "all", "-j", str(job_id), "-O", "JobArrayID:0|,Comment:0"]
    assert backend.job_state(str(job_id)) in ("PENDING", "FAILED")
    record = backend.job_record(job_id)
    assert (record["JobName"], record["Comment"], record["WorkDir"]) == (truth["name"], truth["comment"],
                                                                         truth["work_dir"])  # fmt: skip
    assert record["UserId"] == "nuro-alice(1001)" and record["Account"] == "nurotest"
    assert record["StdOut"] == f"{truth['work_dir']}/o JobId=1 {job_id}|{truth['name']}.out"
    assert record["Requeue"] == "1" and record["QOS"] == "normal" and record["JobId"] == str(job_id)
    assert not any(a[:2] == ["squeue", "--json"] for a in fake.argvs())  # cheap reads only, whatever the queue


def test_reads_of_an_array_record_come_from_json(tmp_path: Path) -> None:
    job_id = HOSTILE[0]["job_id"]
    fake = (
        FakeSlurm(tmp_path)
        .on(f"squeue -h -t all -j {job_id}", stdout=f"{job_id}_[1-3]|x\n{job_id}_4|y\n")
        .on("squeue --json", file="squeue_hostile.json")
    )
    backend = fake.backend()
    assert backend.job_comment(job_id) == HOSTILE[0]["comment"]
    assert fake.argvs()[1] == ["squeue", "--json", "-t", "all", "-j", str(job_id)]
    assert backend.job_record(job_id)["JobName"] == HOSTILE[0]["name"]
    (tmp_path / "x").mkdir()
    with pytest.raises(InvalidJobId, match="lists no job 999999"):
        FakeSlurm(tmp_path / "x").on("squeue -h", stdout="999999_1|x\n").on(
            "squeue --json", file="squeue_hostile.json"
        ).backend().job_record(999999)


def test_job_ids_are_checked_before_slurm_runs(tmp_path: Path) -> None:
    fake = FakeSlurm(tmp_path)
    for bad in ("1 --all", "12_3", "²", "١٢", ""):  # "²" and Arabic-Indic digits pass str.isdigit
        with pytest.raises(InvalidJobId, match="not a plain Slurm job id"):
            fake.backend().job_comment(bad)
    assert fake.argvs() == []


def test_a_job_that_just_left_slurmctld_is_an_invalid_job_id(tmp_path: Path) -> None:
    backend = FakeSlurm(tmp_path).on("squeue -h", stdout="").backend()
    for read in (backend.job_comment, backend.job_state, backend.job_record):
        with pytest.raises(InvalidJobId, match="lists no job 12"):
            read(12)


def test_the_bulk_job_read_asks_24_11_and_later_for_plain_numbers(tmp_path: Path) -> None:
    """From 24.11 the snapshot's squeue is ``--json=<newest parser>+complex``, chosen once from ``--json=list``;
    22.05 (the fixture above) keeps ``--json``."""
    fake = (
        FakeSlurm(tmp_path)
        .on("squeue --json=list", stdout="data_parser/v0.0.42\ndata_parser/v0.0.40\ndata_parser/v0.0.41\n")
        .on("squeue --json=v0.0.42+complex", file="v26.05/squeue_held_complex.json")
        .on("sinfo --version", stdout="slurm-wlm 24.11.5\n")
    )
    backend = fake.backend()
    assert [j.job_id for j in backend.jobs()] == [1, 2, 3]
    backend.jobs()
    argvs = fake.argvs()
    assert argvs.count(["squeue", "--json=list"]) == 1
    assert argvs.count(["squeue", "--json=v0.0.42+complex", "-t", "all"]) == 2


def test_22_05_keeps_plain_json(fake: FakeSlurm) -> None:
    fake.backend().jobs()
    assert ["squeue", "--json", "-t", "all"] in fake.argvs() and ["squeue", "--json=list"] not in fake.argvs()


def test_an_applied_action_is_logged_with_what_it_acted_on() -> None:
    """The controller's log said ``job_id=None`` for a requeue of job 43: only a Submit's new job was logged."""
    from nuro.slurm.actions import DrainNode, Requeue, Submit, UpdateJobs, UpdateQosMinGpus
    from nuro.slurm.cli_writes import _target

    assert _target(Requeue(job_id=43), None) == "job_id=43"
    assert _target(DrainNode(node="gpu003", reason="nuro: test"), None) == "node=gpu003"
    assert _target(UpdateQosMinGpus(qos="g-perception", gpus=None), None) == "qos=g-perception"
    assert _target(Submit(script="#!/bin/bash\n"), 77) == "job_id=77"
    assert _target(UpdateJobs(job_ids=(1, 2), qos="b-perception"), None) == "job_ids=1,2"
    assert _target(UpdateJobs(job_ids=tuple(range(500)), qos="b-perception"), None).endswith("8,9,... (500)")
