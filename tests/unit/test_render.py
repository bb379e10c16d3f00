"""render_submission: whole-script golden tests, the run record, purity, and the bridge preview."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from nuro.jobspec import build_spec
from nuro.jobspec.codepin import CodePin, digest_bytes
from nuro.jobspec.pins import DatasetPin
from nuro.jobspec.preview import PolicySource, load_policy_source
from nuro.jobspec.render import ClusterFacts, Pins, RenderError, render_submission, slurm_time
from nuro.jobspec.submission import preview
from nuro.login.sbatch_cli import insert_preamble, platform_metadata, render_preamble
from nuro.policy import load_policy
from nuro.policy.luatable import TABLE_FILE, policy_table, render_lua_table
from nuro.protocol import jobcomment
from nuro.protocol.contract import EXIT_REQUEUE

REPO = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "3f" * 32
COMMIT = "9c1e2d4b5a6978812233445566778899aabbccdd"
PATCH = b"diff --git a/VERSION b/VERSION\n--- a/VERSION\n+++ b/VERSION\n@@ -1 +1 @@\n-A\n+B\n"
BASE = {
    "name": "resnet50-ddp",
    "team": "perception",
    "dataset": f"imagenet@{DIGEST}",
    "code.repo": "/shared/alice/vision",
    "entrypoint.script": "train.py",
    "run_root": "/shared/runs/alice",
}
CLEAN = Pins(CodePin("/shared/alice/vision", COMMIT), DatasetPin("imagenet", DIGEST))
DIRTY = Pins(CodePin("/shared/alice/vision", COMMIT, True, PATCH, digest_bytes(PATCH)), DatasetPin("imagenet", DIGEST))

CASES = {
    "ddp_2node": (
        {"nodes": 2, "time_limit": "4:00:00", "entrypoint.args": ["--epochs", 90, "--lr=3e-4"],
         "env": {"NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": 4}, "checkpoint.interval_s": 900},
        CLEAN,
    ),
    "cpu_dirty_resume": (
        {"name": "smoke", "gpus_per_node": 0, "tier": "urgent", "resume_from": "4242", "max_requeues": 0,
         "time_limit": 30, "entrypoint.python": "/shared/venvs/torch/bin/python", "code.allow_dirty": True},
        DIRTY,
    ),
    "deepspeed_8node": (
        {"name": "llm-z3", "nodes": 8, "gpus_per_node": 8, "time_limit": "2-00:00:00", "stop_warning_s": 600,
         "entrypoint.script": "llm/pretrain.py", "entrypoint.deepspeed_config": "llm/ds_z3.json"},
        CLEAN,
    ),
}  # fmt: skip


def render(case: str, facts: ClusterFacts | None = None):
    layer, pins = CASES[case]
    return render_submission(build_spec(BASE, layer), pins, facts)


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_scripts(case: str, golden) -> None:
    golden(f"sbatch_{case}.sh", render(case).script)


@pytest.mark.parametrize("case", sorted(CASES))
def test_scripts_are_valid_bash(case: str, tmp_path: Path) -> None:
    path = tmp_path / "job.sh"
    path.write_text(render(case).script)
    out = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_golden_nuro_sbatch_preamble(golden) -> None:
    user_script = "#!/bin/bash\n#SBATCH -N 2\n#SBATCH --gpus-per-node=8\n\n# my job\nsrun python train.py\n"
    values = {"checkpoint.interval_s": 600}
    meta = platform_metadata(values, "perception", CLEAN.dataset, CLEAN.code)
    text = insert_preamble(user_script, render_preamble(meta, CLEAN.code, "/shared/runs/alice", "src"))
    golden("sbatch_nuro_sbatch_preamble.sh", text)
    assert text.startswith("#!/bin/bash\n#SBATCH -N 2\n#SBATCH --gpus-per-node=8\n\n# my job\n# --- nuro-sbatch")
    assert text.endswith("# --- end of the nuro-sbatch preamble ---\nsrun python train.py\n")
    out = subprocess.run(["sh", "-n", "-c", text], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_run_record_carries_digests_never_tags_and_no_env() -> None:
    req = render("ddp_2node")
    assert req.args == (f"--comment={req.comment}",)
    assert req.argv == ("sbatch", "--parsable", f"--comment={req.comment}")
    assert " " not in req.comment and len(req.comment.encode()) <= jobcomment.MAX_COMMENT_BYTES
    record = jobcomment.parse(req.comment).raw["nuro"]
    assert record == {
        "v": 1, "name": "resnet50-ddp", "team": "perception",
        "dataset": {"name": "imagenet", "digest": DIGEST},
        "code": {"repo": "/shared/alice/vision", "commit": COMMIT},
        "entry": {"launcher": "torchrun", "script": "train.py", "args": ["--epochs", "90", "--lr=3e-4"]},
        "ckpt_policy": {"interval_s": 900, "keep": 3}, "requeue": {"max": 3},
    }  # fmt: skip
    assert "NCCL_DEBUG" not in req.comment and req.output_dir == "/shared/runs/alice/resnet50-ddp"


def test_dirty_record_names_the_patch() -> None:
    record = render("cpu_dirty_resume").meta
    assert record["code"]["diff"] == digest_bytes(PATCH)
    assert record["tier"] == "urgent" and record["resume_from"] == "4242"


def test_the_comment_is_the_run_record_alone_within_slurms_cap() -> None:
    """Issue 30: nothing is appended to the comment after submit, so what submit writes is all it ever holds."""
    comment = render("ddp_2node").comment
    assert set(json.loads(comment)) == {"nuro"} and len(comment.encode()) <= jobcomment.MAX_COMMENT_BYTES
    long_repo = Pins(CodePin("/shared/" + "r" * 192, COMMIT), DatasetPin("imagenet", DIGEST))
    args = {"entrypoint.args": [f"--opt{i}=value{i}" for i in range(12)]}
    req = render_submission(build_spec(BASE, args), long_repo, None)
    assert 700 < len(req.comment) <= 1024  # a 200-character repo path and 12 arguments fit
    many = {"entrypoint.args": [f"--option-number-{i}=a-long-value-{i}" for i in range(40)]}
    too_long = r"does not fit the job comment: .* over the 1,024 Slurm allows in a job comment; longest: nuro\.entry"
    with pytest.raises(RenderError, match=too_long):
        render_submission(build_spec(BASE, many), long_repo, None)


def test_render_is_pure_and_the_request_frozen() -> None:
    a, b = render("ddp_2node"), render("ddp_2node")
    assert a == b and a.script == b.script
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.script = "#!/bin/sh\n"  # type: ignore[misc]


@pytest.mark.parametrize(("nodes", "leaf", "want"), [(1, 4, None), (2, 4, "1@0:01:00"), (4, 4, "1@0:01:00"),
                                                     (5, 4, None), (8, 8, "1@0:01:00")])  # fmt: skip
def test_switch_hint_only_when_the_job_fits_one_leaf(nodes: int, leaf: int, want: str | None) -> None:
    req = render_submission(build_spec(BASE, {"nodes": nodes}), CLEAN, ClusterFacts(leaf_nodes=leaf))
    lines = [x for x in req.script.splitlines() if x.startswith("#SBATCH --switches")]
    assert lines == ([f"#SBATCH --switches={want}"] if want else [])


@pytest.mark.parametrize(("hint", "want"), [("segment", "#SBATCH --segment=2"), ("none", None)])
def test_block_clusters_render_a_segment_or_nothing(hint: str, want: str | None) -> None:
    req = render_submission(build_spec(BASE, {"nodes": 2}), CLEAN, ClusterFacts(leaf_nodes=4, topology_hint=hint))
    lines = [x for x in req.script.splitlines() if x.startswith(("#SBATCH --segment", "#SBATCH --switches"))]
    assert lines == ([want] if want else [])


def test_preview_takes_the_cluster_facts_from_the_bridges_table(tmp_path: Path) -> None:
    """policy apply renders the table from the cluster (leaf size, hint); the preview must judge with the same facts,
    and then agrees with the bridge's digest."""
    policy_file = REPO / "examples/policy/teams.yaml"
    (tmp_path / "slurm.conf").write_text("")
    (tmp_path / TABLE_FILE).write_text(render_lua_table(load_policy(policy_file), leaf_size=8, hint="segment"))
    source = load_policy_source(str(policy_file), {"SLURM_CONF": str(tmp_path / "slurm.conf")})
    assert source is not None and source.matches_bridge is True
    assert (source.table["leaf_nodes"], source.table["topology_hint"]) == (8, "segment")
    facts = ClusterFacts.from_policy_table(source.table)
    assert (facts.leaf_nodes, facts.topology_hint) == (8, "segment")


def test_run_root_is_required_and_time_formats() -> None:
    spec = build_spec({k: v for k, v in BASE.items() if k != "run_root"})
    with pytest.raises(RenderError, match="run_root is not set"):
        render_submission(spec, CLEAN)
    assert slurm_time(90) == "0-00:01:30" and slurm_time(2 * 86400 + 3661) == "2-01:01:01"
    assert EXIT_REQUEUE == 75


def test_preview_of_the_rendered_request_matches_the_bridge_rules() -> None:
    table = policy_table(load_policy(REPO / "examples/policy/teams.yaml"))
    source = PolicySource(table=table, path="examples/policy/teams.yaml", bridge_digest=None)
    adm = preview(render("ddp_2node"), source, "alice")
    assert adm.accepted and adm.team == "perception" and adm.gpus == 16 and adm.qos == "g-perception"
    assert adm.changes == ()  # qos, account, requeue and the switch hint are already in the script
    big = render_submission(build_spec(BASE, {"nodes": 6}), CLEAN)
    adm = preview(big, source, "alice")
    assert not adm.accepted and adm.code == "ESLURM_ACCOUNTING_POLICY" and "asks 48" in adm.message
    urgent = render("cpu_dirty_resume")
    assert preview(urgent, source, "alice").accepted  # perception may use urgent
    chen = render_submission(build_spec(BASE, {"team": "controls", "tier": "urgent"}), CLEAN)
    assert preview(chen, source, "chen").reason.value == "tier_denied"
    assert json.loads(big.comment)["nuro"]["team"] == "perception"


def test_spares_are_allocated_on_top_and_the_step_trains_on_the_rest() -> None:
    """--spare-nodes K: N+K nodes with --no-kill (quota and topology see all of them), the step on N, the count in
    the record and the job's environment for nuro-launch --step."""
    req = render_submission(build_spec(BASE, {"nodes": 2, "spare_nodes": 1}), CLEAN, ClusterFacts(leaf_nodes=4))
    lines = req.script.splitlines()
    assert "#SBATCH --nodes=3" in lines and "#SBATCH --no-kill" in lines and "#SBATCH --switches=1@0:01:00" in lines
    assert "export NURO_SPARE_NODES=1" in lines
    assert any(x.strip().startswith("srun --nodes=2 --ntasks=2 ") for x in lines)
    assert json.loads(req.comment)["nuro"]["spares"] == {"nodes": 1}
    plain = render_submission(build_spec(BASE, {"nodes": 2}), CLEAN)
    assert "--no-kill" not in plain.script and "NURO_SPARE_NODES" not in plain.script
    assert "spares" not in json.loads(plain.comment)["nuro"]  # records without spares keep their bytes


def test_spares_count_in_the_quota_preview() -> None:
    table = policy_table(load_policy(REPO / "examples/policy/teams.yaml"))
    source = PolicySource(table=table, path="examples/policy/teams.yaml", bridge_digest=None)
    adm = preview(render_submission(build_spec(BASE, {"nodes": 2, "spare_nodes": 1}), CLEAN), source, "alice")
    assert adm.gpus == 24
