"""One run record and one job environment for both submit paths (``nuro.jobspec.record``)."""

from __future__ import annotations

import shlex

from nuro.jobspec import build_spec
from nuro.jobspec.record import job_env, run_record
from nuro.jobspec.render import render_submission
from nuro.login.sbatch_cli import platform_metadata, render_preamble
from tests.unit.test_render import BASE, CASES, CLEAN


def test_the_rendered_script_exports_every_variable_of_its_record() -> None:
    for layer, pins in CASES.values():
        req = render_submission(build_spec(BASE, layer), pins)
        for name, value in job_env(req.meta).items():
            assert f"\nexport {name}={shlex.quote(value)}\n" in req.script, name


def test_nuro_sbatch_builds_the_same_record_and_env_as_nuro_train() -> None:
    req = render_submission(build_spec(BASE, {}), CLEAN)
    sbatch = platform_metadata({}, "perception", CLEAN.dataset, CLEAN.code)
    assert sbatch["via"] == "nuro-sbatch" and set(sbatch) - {"via"} == set(req.meta) - {"name", "entry"}
    assert {k: v for k, v in sbatch.items() if k != "via"} == {
        k: v for k, v in req.meta.items() if k not in ("name", "entry")
    }
    assert job_env(sbatch) == {k: v for k, v in job_env(req.meta).items() if k != "NURO_RUN_NAME"}
    preamble = render_preamble(sbatch, CLEAN.code, "/runs", None)
    assert all(f"export {k}={shlex.quote(v)}" in preamble for k, v in job_env(sbatch).items())


def test_keys_without_a_value_are_left_out() -> None:
    meta = run_record(team="t", dataset=None, code=None, ckpt_interval_s=60, ckpt_keep=2, max_requeues=0)
    assert meta == {"v": 1, "team": "t", "ckpt_policy": {"interval_s": 60, "keep": 2}, "requeue": {"max": 0}}
    assert job_env(meta) == {"NURO_TEAM": "t", "NURO_CKPT_INTERVAL_S": "60", "NURO_CKPT_KEEP": "2",
                             "NURO_MAX_REQUEUES": "0", "NURO_PREEMPT_SIGNAL": "USR1"}  # fmt: skip
