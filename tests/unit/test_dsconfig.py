"""A DeepSpeed config checked at submit (nuro.jobspec.dsconfig): the batch arithmetic at the job's world size,
what the installed DeepSpeed refuses, and notes on keys it ignores; the launcher option of the job spec; the
nuro-sbatch flags that carry both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nuro.jobspec.dsconfig import batch_problems, check_config, unknown_key_notes
from nuro.jobspec.sbatch_args import parse_options
from nuro.jobspec.spec import SpecError, build_spec
from nuro.login.sbatch_cli import world_size
from tests.unit.test_codepin import git
from tests.unit.test_jobspec import BASE
from tests.unit.test_jobspec_sbatch_cli import DIGEST, nuro_sbatch

T, M, G = "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"


@pytest.mark.parametrize(
    ("cfg", "world", "want"),
    [
        ({T: 32, M: 8}, 4, ""),
        ({T: 32, M: 8, G: 1}, 4, ""),
        ({M: 8, G: 3}, 16, ""),
        ({T: 64}, 16, ""),
        ({T: 32, M: 8, G: 2}, 4, "set it to 64"),
        ({T: 30, M: 8}, 2, "multiple of train_micro_batch_size_per_gpu 8 × 2 ranks (= 16)"),
        ({T: 8, M: 8}, 2, "use a multiple of 16"),
        ({T: 10}, 4, "use a multiple of 4"),
        ({T: 12, G: 4}, 2, "gradient_accumulation_steps 4 × 2 ranks (= 8)"),
        ({G: 2}, 1, "give train_batch_size or train_micro_batch_size_per_gpu"),
        ({T: "32"}, 1, "train_batch_size must be a whole number"),
        ({M: 0}, 1, "must be a whole number of at least 1"),
    ],
)
def test_batch_sizes_must_hold_at_the_jobs_world_size(cfg: dict, world: int, want: str) -> None:
    problems = batch_problems(cfg, world)
    assert (problems == []) if not want else (len(problems) == 1 and want in problems[0]), problems


def test_unknown_top_level_keys_get_a_note_with_the_nearest_known_key() -> None:
    notes = unknown_key_notes(
        {"zero_optimisation": {}, "optimizer": {}, "my_model": {}}, {"zero_optimization", "optimizer"}
    )
    assert notes == ["DeepSpeed ignores the top-level key 'zero_optimisation' (did you mean 'zero_optimization'?)",
                     "DeepSpeed ignores the top-level key 'my_model'"]  # fmt: skip


def _check(cfg: dict, world: int = 2):
    return check_config(json.dumps(cfg).encode(), world=world)


def test_the_installed_deepspeed_judges_the_sections() -> None:
    ok = _check({M: 8, "zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                 "scheduler": {"type": "WarmupLR"}, "activation_checkpointing": {}, "flops_profiler": {},
                 "checkpoint": {"use_node_local_storage": True}})  # fmt: skip
    assert ok.problems == [] and ok.notes == [] and ok.deepspeed_version
    bad = _check({M: 8, "zero_optimization": {"stage": 2, "overlap_comms": True}})
    assert bad.problems == [
        f"DeepSpeed {bad.deepspeed_version} rejects DeepSpeedZeroConfig overlap_comms: Extra inputs are not permitted"
    ]
    typo = _check({M: 8, "zero_optimisation": {"stage": 2}})
    assert typo.problems == [] and "did you mean 'zero_optimization'" in typo.notes[0]
    assert "set it to 32" in _check({T: 16, M: 8, G: 2}, world=2).problems[0]  # DeepSpeed's own check ran at 1


def test_unreadable_configs_are_refused() -> None:
    assert "is not valid JSON" in check_config(b"{nope", world=1).problems[0]
    assert "must be a JSON object" in check_config(b"[1]", world=1).problems[0]
    assert "is not valid JSON" in check_config(b"\xff\xfe", world=1).problems[0]
    assert "at most" in check_config(b" " * (1024 * 1024 + 1), world=1).problems[0]


def test_the_launcher_follows_the_config_and_conflicts_are_refused() -> None:
    assert build_spec(BASE, {"entrypoint.deepspeed_config": "ds.json"}).launcher == "deepspeed"
    assert build_spec(BASE, {"entrypoint.launcher": "torchrun"}).launcher == "torchrun"
    with pytest.raises(SpecError, match="deepspeed needs entrypoint.deepspeed_config"):
        build_spec(BASE, {"entrypoint.launcher": "deepspeed"})
    with pytest.raises(SpecError, match="given with launcher torchrun"):
        build_spec(BASE, {"entrypoint.launcher": "torchrun", "entrypoint.deepspeed_config": "ds.json"})
    with pytest.raises(SpecError, match="must be one of torchrun, deepspeed"):
        build_spec(BASE, {"entrypoint.launcher": "horovod"})
    assert build_spec(BASE, {"nodes": 2, "gpus_per_node": 4, "spare_nodes": 1}).world_size == 8


@pytest.mark.parametrize(
    ("argv", "want"),
    [(["-N", "2", "--gpus-per-node=8"], 16), (["--nodes=3", "--ntasks-per-node=2"], 6), (["--gres=gpu:4"], 4),
     (["-N", "2-4"], 2), ([], 1)],
)  # fmt: skip
def test_nuro_sbatch_reads_the_world_size_from_sbatchs_options(argv: list[str], want: int) -> None:
    assert world_size(parse_options(argv)) == want


def test_nuro_sbatch_checks_the_config_and_exports_it(tmp_path: Path) -> None:
    repo = tmp_path / "pred"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "job.sh").write_text("#!/bin/bash\n#SBATCH -N 2\n#SBATCH --gpus-per-node=8\npython train.py\n")
    (repo / "ds.json").write_text(json.dumps({T: 128, M: 8, "zero_optimisation": {"stage": 2}}))
    (repo / "bad.json").write_text(json.dumps({T: 48, M: 8}))
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "one")
    common = ["--team", "prediction", f"--dataset=tracks@{DIGEST}", "--code", str(repo), "--dry-run"]
    out = nuro_sbatch(*common, "--deepspeed-config", "bad.json", "job.sh", cwd=repo)
    assert out.returncode == 3 and "train_batch_size 48 is not a multiple of" in out.stderr, out.stderr
    assert "16 ranks" in out.stderr  # -N 2 × --gpus-per-node=8 from the script's #SBATCH lines
    out = nuro_sbatch(*common, "--deepspeed-config", "ds.json", "job.sh", cwd=repo)
    assert out.returncode == 0, out.stderr
    assert "note: entrypoint.deepspeed_config (ds.json): DeepSpeed ignores the top-level key 'zero_optimisation'" in (
        out.stderr)  # fmt: skip
    assert "export NURO_DEEPSPEED_CONFIG=ds.json" in out.stdout
    assert '"entry":{"deepspeed_config":"ds.json","launcher":"deepspeed"}' in out.stdout
    out = nuro_sbatch(*common, "--deepspeed-config", "missing.json", "job.sh", cwd=repo)
    assert out.returncode == 3 and "missing.json" in out.stderr, out.stderr
    out = nuro_sbatch("--team", "prediction", "--launcher", "deepspeed", "job.sh", cwd=repo)
    assert out.returncode == 3 and "--launcher deepspeed: needs --deepspeed-config" in out.stderr


def test_resume_keeps_the_launcher_and_the_config() -> None:
    from nuro.jobspec.codepin import CodePin
    from nuro.jobspec.pins import DatasetPin
    from nuro.jobspec.record import comment_json, job_env, run_record
    from nuro.login.resume_cli import resume_flags
    from nuro.slurm.models import JobInfo, JobPhase

    entry = {"launcher": "deepspeed", "script": "train.py", "args": [], "deepspeed_config": "ds.json"}
    meta = run_record(team="prediction", dataset=DatasetPin("tracks", DIGEST), code=CodePin("/r", "a" * 40),
                      ckpt_interval_s=60, ckpt_keep=2, max_requeues=3, name="traj", entry=entry)  # fmt: skip
    assert job_env(meta)["NURO_DEEPSPEED_CONFIG"] == "ds.json"
    job = JobInfo(job_id=41, name="traj", user="priya", state="COMPLETED", phase=JobPhase.COMPLETED,
                  account="prediction", comment=comment_json(meta))  # fmt: skip
    flags = resume_flags(job, None, None, None)
    assert flags["entrypoint.launcher"] == "deepspeed" and flags["entrypoint.deepspeed_config"] == "ds.json"
    assert build_spec(BASE, {k: v for k, v in flags.items() if k.startswith("entrypoint.")}).launcher == "deepspeed"
