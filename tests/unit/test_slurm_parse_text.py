"""Text outputs (scontrol -o, topology, sacct/sacctmgr -P, sbatch --parsable, versions, squeue -o), mostly on
captures from the real dev cluster (Slurm 22.05.8); inline strings only where a capture cannot show the case."""

from __future__ import annotations

from pathlib import Path

import pytest

from nuro.slurm import JobPhase, NodeInfo, SlurmParseError, SlurmVersion
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
    parse_version,
)

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
    (rec,) = parse_scontrol_show_oneliner("NodeName=n1 Reason=disk a=b full [root@2024-01-01T00:00:00] State=IDLE")
    assert rec == {"NodeName": "n1", "Reason": "disk a=b full [root@2024-01-01T00:00:00]", "State": "IDLE"}


def test_topology_maps_each_node_to_its_leaf() -> None:
    switch_of = parse_scontrol_show_topology(read("scontrol_show_topology.txt"))
    assert switch_of == {
        **{f"gpu00{i}": "leaf01" for i in range(1, 5)},
        **{f"gpu00{i}": "leaf02" for i in range(5, 9)},
    }
    assert parse_scontrol_show_topology("") == {}
    assert parse_scontrol_show_topology("No topology information available\n") == {}


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


def test_squeue_format_fallback() -> None:
    jobs = parse_squeue_format(read("squeue_format_fallback.txt"))
    gang = max((j for j in jobs if j.name == "nuro-gang"), key=lambda j: j.job_id)
    assert gang.phase is JobPhase.RUNNING and gang.nodes == ("gpu001", "gpu002")
    assert (gang.gpus_per_node, gang.gpus_total) == (8, 16)
    assert gang.comment == '{"run":"x","team":"vision"}' and gang.start_time is not None
    held = max((j for j in jobs if j.name == "nuro-held"), key=lambda j: j.job_id)
    assert held.phase is JobPhase.PENDING and held.start_time is None and held.nodes == ()
    ok = max((j for j in jobs if j.name == "nuro-ok"), key=lambda j: j.job_id)
    assert ok.gres_per_node == "" and ok.comment == '{"run":"ok"}'
