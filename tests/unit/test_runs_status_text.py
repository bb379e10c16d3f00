"""``nuro-train status JOB`` and ``ls`` as people read them (login/runs_cli.py): no Python reprs, no bare "no runs"."""

from __future__ import annotations

from nuro.login.runs_cli import empty_listing, status_lines

DIGEST = "sha256:" + "ab" * 32
RECORD = {
    "v": 1, "name": "demo", "team": "perception", "dataset": {"name": "demo-synth", "digest": DIGEST},
    "code": {"repo": "/srv/r", "commit": "c" * 40, "diff": "sha256:" + "d" * 64},
    "entry": {"launcher": "torchrun", "script": "train.py", "args": ["--steps", "100"]},
    "ckpt_policy": {"interval_s": 1800, "keep": 3}, "requeue": {"max": 3},
}  # fmt: skip


def test_status_text_has_no_python_reprs_and_says_each_part_once() -> None:
    row = {
        "job_id": 12, "name": "demo", "team": "perception", "nodes": ["gpu001", "gpu002"], "started": None,
        "dataset": RECORD["dataset"], "code": RECORD["code"], "nuro": RECORD, "record": {"nuro": RECORD},
        "note": {"preempt": {"by": 14, "why": "urgent job 14 needs 8 GPUs"}}, "waiting": {"slurm_reason": "x"},
    }  # fmt: skip
    lines = status_lines(row)
    text = "\n".join(f"{k} {t}" for k, t in lines)
    assert not any(c in text for c in "{}'"), text
    assert ("dataset", f"demo-synth@{DIGEST}") in lines
    assert ("code", f"/srv/r@{'c' * 40} diff=sha256:{'d' * 64}") in lines
    assert ("nodes", "gpu001,gpu002") in lines and ("note", "preempt: by=14 why=urgent job 14 needs 8 GPUs") in lines
    record = [t for k, t in lines[lines.index(("record", "v: 1")) :] if k in ("record", "")][:4]
    assert record == ["v: 1", "entry: launcher=torchrun script=train.py args=--steps 100",
                      "ckpt_policy: interval_s=1800 keep=3", "requeue: max=3"]  # fmt: skip
    assert not any(k in ("started", "waiting", "nuro") for k, _ in lines), "empty rows and own views are not plain rows"


def test_an_empty_ls_says_what_it_looked_at_and_how_to_look_further() -> None:
    """After ``make demo`` as root a bare "no runs" hid that the demo's runs are alice's and have ended."""
    assert empty_listing("root", None, False, False) == (
        "no active runs of root (--recent: also those that ended in the last minutes; "
        "--team TEAM or --all: other users' runs)"
    )
    assert empty_listing("alice", "perception", False, True) == "no runs of team perception"
    assert empty_listing("alice", None, True, False).startswith("no active runs of any user (--recent")
