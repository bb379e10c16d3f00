"""nuro.protocol.jobrecord: the prolog's root-owned record of a job, built from slurmd's environment, never the job's
word."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nuro.protocol import jobrecord
from nuro.protocol.jobrecord import JobRecord, JobRecordError
from nuro.safeio.safefs import UnsafePath


def _env(comment: dict | None = None, **over: str) -> dict[str, str]:
    env = {
        "SLURM_JOB_ID": "42", "SLURM_JOB_UID": "1001", "SLURM_JOB_GID": "1001", "SLURM_JOB_USER": "alice",
        "SLURM_JOB_ACCOUNT": "vision", "SLURMD_NODENAME": "gpu001", "SLURM_JOB_RESTART_COUNT": "2",
    }  # fmt: skip
    if comment is not None:
        env["SLURM_JOB_COMMENT"] = json.dumps(comment, separators=(",", ":"), sort_keys=True)
    env.update(over)
    return env


def test_team_is_the_account_and_run_comes_from_a_matching_record() -> None:
    rec = jobrecord.from_prolog_env(_env({"nuro": {"name": "r1", "team": "vision", "ckpt_policy": {"keep": 5}}}))
    assert rec == JobRecord(42, 1001, 1001, "alice", "vision", "vision", "r1", 2, "gpu001", 5)


def test_a_record_naming_another_team_gives_no_run() -> None:
    rec = jobrecord.from_prolog_env(_env({"nuro": {"name": "their-run", "team": "nlp"}}))
    assert (rec.team, rec.run, rec.keep) == ("vision", None, None)


def test_a_plain_job_has_the_account_as_team_and_no_run() -> None:
    rec = jobrecord.from_prolog_env(_env(None))
    assert (rec.team, rec.run) == ("vision", None)


def test_an_account_that_is_no_team_name_gives_no_team() -> None:
    rec = jobrecord.from_prolog_env(_env({"nuro": {"name": "r", "team": "Bad-Acct"}}, SLURM_JOB_ACCOUNT="Bad-Acct"))
    assert (rec.account, rec.team, rec.run) == ("Bad-Acct", None, None)


def test_a_bad_run_name_or_keep_is_not_taken() -> None:
    rec = jobrecord.from_prolog_env(_env({"nuro": {"name": "../x", "team": "vision"}}))
    assert rec.run is None
    rec = jobrecord.from_prolog_env(_env({"nuro": {"name": "r", "team": "vision", "ckpt_policy": {"keep": True}}}))
    assert (rec.run, rec.keep) == ("r", None)


def test_missing_slurmd_fields_are_an_error() -> None:
    with pytest.raises(JobRecordError, match="SLURM_JOB_UID"):
        jobrecord.from_prolog_env({k: v for k, v in _env().items() if k != "SLURM_JOB_UID"})
    with pytest.raises(JobRecordError, match="SLURM_JOB_ID"):
        jobrecord.from_prolog_env(_env(SLURM_JOB_ID="12;rm"))


def test_write_read_remove_roundtrip(tmp_path: Path) -> None:
    rec = jobrecord.from_prolog_env(_env({"nuro": {"name": "r1", "team": "vision"}}))
    path = jobrecord.write(tmp_path, rec)
    st = os.stat(path)
    assert st.st_mode & 0o777 == 0o644 and os.stat(tmp_path / ".jobs").st_mode & 0o777 == 0o755
    assert jobrecord.read(tmp_path, 42) == rec
    assert jobrecord.remove(tmp_path, 42) and jobrecord.read(tmp_path, 42) is None
    assert not jobrecord.remove(tmp_path, 42)


def test_read_refuses_what_is_not_a_root_owned_regular_file(tmp_path: Path) -> None:
    rec = jobrecord.from_prolog_env(_env())
    jobrecord.write(tmp_path, rec)
    jobs = tmp_path / ".jobs"
    (jobs / "43.json").symlink_to(jobs / "42.json")
    with pytest.raises(UnsafePath, match="symlink"):
        jobrecord.read(tmp_path, 43)
    os.mkfifo(jobs / "44.json")
    with pytest.raises(UnsafePath, match="FIFO"):
        jobrecord.read(tmp_path, 44)
    (jobs / "45.json").write_bytes(b" " * 5000)
    with pytest.raises(UnsafePath, match="larger"):
        jobrecord.read(tmp_path, 45)
    if os.geteuid() == 0:
        (jobs / "46.json").write_bytes(rec.to_json())
        os.chown(jobs / "46.json", 1001, 1001)
        with pytest.raises(UnsafePath, match="not root"):
            jobrecord.read(tmp_path, 46)


def test_read_is_strict(tmp_path: Path) -> None:
    rec = jobrecord.from_prolog_env(_env())
    jobrecord.write(tmp_path, rec)
    jobs = tmp_path / ".jobs"
    body = json.loads(rec.to_json())
    for bad in ({**body, "extra": 1}, {**body, "uid": "0"}, {**body, "team": "../x"}, {**body, "job_id": 41}, []):
        (jobs / "42.json").write_bytes(json.dumps(bad).encode())
        with pytest.raises(JobRecordError):
            jobrecord.read(tmp_path, 42)


def test_a_symlinked_jobs_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / ".jobs").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafePath):
        jobrecord.write(tmp_path, jobrecord.from_prolog_env(_env()))
    assert list((tmp_path / "elsewhere").iterdir()) == []
