"""Text outputs (scontrol -o, topology, sacct/sacctmgr -P, sbatch --parsable, versions, squeue -o), mostly on
captures from the real dev cluster (Slurm 22.05.8); inline strings only where a capture cannot show the case."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nuro.slurm import JobPhase, NodeInfo, SlurmParseError, SlurmVersion
from nuro.slurm.cli_reads import RECORD_FIXED
from nuro.slurm.parse import (
    attach_switches,
    parse_sacct_exitcodes,
    parse_sacctmgr_parsable,
    parse_sbatch_parsable,
    parse_scontrol_partitions,
    parse_scontrol_show_oneliner,
    parse_scontrol_show_topology,
    parse_sinfo_json,
    parse_squeue_format,
    parse_squeue_json,
    parse_squeue_one_field,
    parse_version,
    topology_kind,
)
from nuro.slurm.parse_text import parse_squeue_fixed_fields

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_scontrol_nodes_oneliner_keeps_values_with_spaces() -> None:
    records = parse_scontrol_show_oneliner(read("scontrol_show_node_oneliner.txt"))
    assert [r["NodeName"] for r in records] == [f"gpu00{i}" for i in range(1, 9)]
    gpu001 = records[0]
    assert gpu001["OS"].startswith("Linux ") and "#1 SMP" in gpu001["OS"]
    assert gpu001["CfgTRES"] == "cpu=16,mem=62.50G,billing=16,gres/gpu=8"
    assert gpu001["AllocTRES"] == "cpu=1,gres/gpu=8" and gpu001["State"] == "MIXED"
    assert gpu001["CoresPerSocket"] == "1"  # followed by two spaces in Slurm's output
    drained = records[7]
    assert drained["State"] == "IDLE+DRAIN"
    assert drained["Reason"].startswith("nuro test [root@")


def test_scontrol_multiline_form_is_accepted() -> None:
    (node,) = parse_scontrol_show_oneliner(read("scontrol_show_node.txt"))
    assert node["NodeName"] == "gpu008" and node["State"] == "IDLE+DRAIN" and node["Gres"] == "gpu:8"
    assert node["Reason"].startswith("nuro test [root@") and node["AllocTRES"] == ""


def test_scontrol_jobs_oneliner() -> None:
    jobs = parse_scontrol_show_oneliner(read("scontrol_show_job_oneliner.txt"))
    gang = max((j for j in jobs if j["JobName"] == "nuro-gang"), key=lambda j: int(j["JobId"]))
    assert gang["JobState"] == "RUNNING" and gang["NodeList"] == "gpu[001-002]"
    assert gang["Comment"] == '{"run":"x","team":"vision"}'
    assert gang["TresPerNode"] == "gres:gpu:8" and gang["Requeue"] == "1"
    assert gang["AllocNode:Sid"].startswith("localhost:") and gang["CPUs/Task"] == "1"
    assert gang["UserId"] == "root(0)"
    requeued = parse_scontrol_show_oneliner(read("scontrol_show_job_requeued.txt"))[0]
    assert requeued["Restarts"] == "1" and requeued["JobState"] == "COMPLETING"


def test_scontrol_value_with_key_like_words() -> None:
    # A free-text value may contain "x=y" as long as the key is not a new capitalised key.
    (rec,) = parse_scontrol_show_oneliner("SwitchName=s1 Reason=disk a=b full [root@2024-01-01T00:00:00] Level=0")
    assert rec == {"SwitchName": "s1", "Reason": "disk a=b full [root@2024-01-01T00:00:00]", "Level": "0"}


def test_topology_maps_each_node_to_its_leaf() -> None:
    switch_of = parse_scontrol_show_topology(read("scontrol_show_topology.txt"))
    assert switch_of == {
        **{f"gpu00{i}": "leaf01" for i in range(1, 5)},
        **{f"gpu00{i}": "leaf02" for i in range(5, 9)},
    }
    assert parse_scontrol_show_topology("") == {}
    assert parse_scontrol_show_topology("No topology information available\n") == {}


def test_topology_block_maps_each_node_to_its_base_block() -> None:
    """26.05 topology/block (captured live): the aggregated block of size 8 lists every node but is no one's own."""
    text = read("v26.05/scontrol_show_topology_block.txt")
    assert "AggregatedBlock=" in text
    assert parse_scontrol_show_topology(text) == {
        **{f"gpu00{i}": "leaf01" for i in range(1, 5)},
        **{f"gpu00{i}": "leaf02" for i in range(5, 9)},
    }


def test_topology_kind_names_the_plugin() -> None:
    assert topology_kind(read("scontrol_show_topology.txt")) == "tree"
    assert topology_kind(read("v26.05/scontrol_show_topology_block.txt")) == "block"
    assert topology_kind(read("v24.11/scontrol_show_topology.txt")) == "tree"
    assert topology_kind("") == topology_kind("No topology information available\n") == "none"


def test_attach_switches_to_sinfo_nodes() -> None:
    nodes, _ = parse_sinfo_json(read("sinfo_8nodes.json"))
    with_switch = attach_switches(nodes, parse_scontrol_show_topology(read("scontrol_show_topology.txt")))
    assert {n.name: n.switch for n in with_switch}["gpu005"] == "leaf02"
    assert all(n.switch for n in with_switch)
    assert attach_switches([NodeInfo(name="x", state="IDLE")], {})[0].switch is None


def test_partitions_from_scontrol() -> None:
    (part,) = parse_scontrol_partitions(read("scontrol_show_partition_oneliner.txt"))
    assert part.name == "gpu" and part.default and part.state == "UP"
    assert part.total_cpus == 128 and part.total_nodes == 8 and len(part.nodes) == 8


def test_sacct_exitcodes_text_has_the_real_code() -> None:
    codes = parse_sacct_exitcodes(read("sacct_exitcodes.txt"))
    assert sorted(codes.values()) == [(0, None), (0, None), (3, None)]
    assert parse_sacct_exitcodes("12|0:15|CANCELLED\n12.batch|0:15|CANCELLED\n") == {12: (0, 15)}


def test_sacctmgr_parsable() -> None:
    rows = parse_sacctmgr_parsable(read("sacctmgr_assoc.txt"), ["cluster", "account", "user", "qos"])
    assert {"cluster": "nuro", "account": "root", "user": "root", "qos": "normal"} in rows
    qos = parse_sacctmgr_parsable(read("sacctmgr_qos.txt"), ["name", "priority", "preempt", "grptres"])
    assert qos[0]["name"] == "normal"
    # -p (not -P) adds a trailing '|'
    assert parse_sacctmgr_parsable("a|b|\n", ["x", "y"]) == [{"x": "a", "y": "b"}]
    with pytest.raises(SlurmParseError, match="2 values for 3 fields"):
        parse_sacctmgr_parsable("a|b\n", ["x", "y", "z"])


def test_sbatch_parsable() -> None:
    assert parse_sbatch_parsable(read("sbatch_parsable.txt")) > 0
    assert parse_sbatch_parsable("123;nuro\n") == 123
    with pytest.raises(SlurmParseError):
        parse_sbatch_parsable("")


def test_version() -> None:
    assert parse_version(read("sinfo_version.txt")) == SlurmVersion(22, 5, 8)
    assert parse_version("slurm 23.11.4") == SlurmVersion(23, 11, 4)
    assert str(SlurmVersion(22, 5, 8)) == "22.05.8"
    assert SlurmVersion(22, 5, 8) < SlurmVersion(23, 2, 0)
    assert not SlurmVersion(22, 5, 8).has_scontrol_json
    with pytest.raises(SlurmParseError):
        parse_version("no version here")


def test_squeue_format_fallback_reads_fixed_fields_only() -> None:
    """Captured with the hostile jobs queued: their names and comments (newlines, '|', 0x1f) move no field."""
    jobs = {j.job_id: j for j in parse_squeue_format(read("squeue_format_fallback.txt"))}
    by_json = {j.job_id: j for j in parse_squeue_json(read("squeue_hostile.json"))}
    assert set(jobs) == set(by_json)  # no record added by a name with a newline
    for truth in HOSTILE["jobs"]:
        job, ref = jobs[truth["job_id"]], by_json[truth["job_id"]]
        assert (job.user, job.account, job.state, job.qos) == (ref.user, ref.account, ref.state, ref.qos)
        assert (job.name, job.comment) == ("", "")  # never read from text: two free fields cannot be split
    done = jobs[HOSTILE["jobs"][-1]["job_id"]]
    assert done.phase is JobPhase.FAILED and done.nodes == ("gpu001",) and done.start_time is not None
    held = jobs[HOSTILE["jobs"][0]["job_id"]]
    assert held.phase is JobPhase.PENDING and held.start_time is None and held.nodes == ()
    with pytest.raises(SlurmParseError, match="15 fields, expected 14"):
        parse_squeue_format(read("squeue_format_fallback.txt").splitlines()[0] + "\x1fextra\n")


# -- issue 11: user-chosen values (captures in hostile_jobs.json; submitted by a team member) ---------------------

HOSTILE = json.loads(read("hostile_jobs.json"))
ONE_FIELD_READS = json.loads(read("squeue_one_field_hostile.json"))


@pytest.mark.parametrize("truth", HOSTILE["jobs"], ids=lambda t: t["case"])
def test_one_field_squeue_read_gives_the_true_value(truth: dict) -> None:
    job_id = truth["job_id"]
    reads = {r["field"]: r["stdout"] for r in ONE_FIELD_READS if r["job_id"] == job_id}
    assert parse_squeue_one_field(reads["Comment"], job_id) == truth["comment"]
    assert parse_squeue_one_field(reads["Name"], job_id) == truth["name"]
    assert parse_squeue_one_field(reads["WorkDir"], job_id) == truth["work_dir"]
    assert parse_squeue_one_field(reads["STDOUT"], job_id) == truth["work_dir"] + "/o JobId=1 %j|%x.out"
    assert parse_squeue_one_field(reads["State"], job_id) in ("PENDING", "FAILED")
    fixed = parse_squeue_fixed_fields(reads["*fixed*"], job_id, [f for _, f in RECORD_FIXED])
    assert fixed is not None
    assert (fixed["UserName"], fixed["Account"], fixed["QOS"]) == (HOSTILE["user"], HOSTILE["account"], "normal")


def test_fixed_fields_read_is_strict() -> None:
    fields = ["State", "Account"]
    assert parse_squeue_fixed_fields("12|RUNNING|vision|\n", 12, fields) == {"State": "RUNNING", "Account": "vision"}
    assert parse_squeue_fixed_fields("12_1|RUNNING|vision|\n12_2|x|y|\n", 12, fields) is None
    for bad in ("12|RUNNING|vi|sion|\n", "12|RUNNING|vision|\n12|x|y|\n", "12|RUNNING|vision|", ""):
        with pytest.raises(SlurmParseError, match="is not 3 fields"):
            parse_squeue_fixed_fields(bad, 12, fields)


def test_one_field_read_refuses_what_is_not_one_plain_job() -> None:
    assert parse_squeue_one_field("12_[1-3]|x\n12_4|y\n", 12) is None  # array: the JSON read decides
    assert parse_squeue_one_field("12+0|x\n12+1|y\n", 12) is None  # het job
    assert parse_squeue_one_field("13|x\n", 12) is None
    assert parse_squeue_one_field("12|(null)\n", 12) == ""
    with pytest.raises(SlurmParseError, match="no record"):
        parse_squeue_one_field("", 12)
    with pytest.raises(SlurmParseError, match="cut off"):
        parse_squeue_one_field("12|abc", 12)


@pytest.mark.parametrize(
    "value",
    ["", "a b", "k=v", "x|y|z", "a\nJobId=1 Comment=x", "\x1f\t", "ends\n", "\n\n", "12|x", "(null) x"],
)
def test_one_field_read_is_exact_for_any_value(value: str) -> None:
    """What squeue prints for a value is "<id>|<value>\\n" (captures above); the value comes back unchanged."""
    assert parse_squeue_one_field(f"12|{value}\n", 12) == value


def test_scontrol_job_text_is_ambiguous_so_nuro_never_reads_it() -> None:
    """Why jobs are read from JSON: in scontrol's own text a name adds fields, and a newline adds records."""
    records = parse_scontrol_show_oneliner(read("scontrol_show_job_hostile.txt"))
    assert len(records) > len(HOSTILE["jobs"])  # names and comments with newlines printed extra "JobId=" lines
    first = next(r for r in records if r["JobId"] == str(HOSTILE["jobs"][0]["job_id"]))
    assert first["Comment"] != HOSTILE["jobs"][0]["comment"]  # the name's " Comment=..." won


def test_node_reason_cannot_set_node_fields() -> None:
    """A drain reason with key-like words (an admin's, or a health check's quoting a job) sets no earlier field."""
    (node,) = parse_scontrol_show_oneliner(read("scontrol_show_node_hostile_reason.txt"))
    assert node["State"] == "IDLE+DRAIN" and node["NodeAddr"] == "127.0.0.1" and node["Partitions"] == "gpu"
    # Comment is printed after Reason (a node's admin comment), so it may end the reason; nothing before it can.
    assert node["Reason"] == "disk State=IDLE NodeAddr=6.6.6.6 Partitions=other"
    assert node["OS"].startswith("Linux ") and node["RealMemory"] == "64000"
    (rec,) = parse_scontrol_show_oneliner("NodeName=n1 State=IDLE Reason=x Arch=evil Foo=bar [root@t]")
    assert rec == {"NodeName": "n1", "State": "IDLE", "Reason": "x Arch=evil Foo=bar [root@t]"}


def test_sacct_exit_codes_of_jobs_with_hostile_names() -> None:
    """``sacct -P`` is asked only for fields without '|' or newlines, so a name like "done|x\\ny=z" moves nothing."""
    codes = parse_sacct_exitcodes(read("sacct_exitcodes_hostile.txt"))
    assert set(codes) == {t["job_id"] for t in HOSTILE["jobs"]}
    assert codes[HOSTILE["jobs"][-1]["job_id"]] == (3, None)
    with pytest.raises(SlurmParseError, match="4 values for 3 fields"):
        parse_sacct_exitcodes("12|done|x|0:0\n")


def test_nuro_reads_no_job_record_as_text() -> None:
    """Every job read is JSON or a one-field squeue read (issue 11); nothing runs ``scontrol show job`` to parse it."""
    repo = Path(__file__).resolve().parents[2]
    offenders = [
        str(path.relative_to(repo))
        for top in ("nuro", "slurm_plugins", "wrappers", "prolog_epilog", "healthcheck")
        for path in (repo / top).rglob("*.py")
        if '"show", "job"' in path.read_text() or '"job", "-o"' in path.read_text()
    ]
    assert offenders == []
