"""Attack: make the job_submit bridge and the Python readers disagree about what a job comment says.

Before issue 11 the bridge read the comment with patterns and the prolog/controller/CLI with ``json.loads``: a comment
such as ``{"nu\\u0072o": {...team B...}}`` or one with the ``nuro`` key twice passed the bridge as "no record" (or as
team A's) while Python read team B's record, and the prolog staged team B's checkpoint. Now there is one parser: a
comment is a record only in the canonical form (nuro.protocol.jobcomment), the bridge refuses every comment that looks
like a
record but is not canonical, with the reason, and Python ignores it. Proved here through real sbatch as team member
alice: the shared comment vectors, the escaped-key and duplicate-key attacks, and a few hundred generated comments,
each judged by real slurmctld + job_submit.lua and by nuro.policy.admission.decide: 0 disagreements.
"""

from __future__ import annotations

import json
import random
import sys

import pytest

from nuro.policy import load_policy
from nuro.policy.admission import JobRequest, decide
from nuro.protocol import jobcomment
from tests import luabridge
from tests.integration.conftest import REPO, LiveCluster
from tests.integration.isolation.conftest import ATTACKER, VICTIM_TEAM, Guard, as_user

pytestmark = pytest.mark.slurm

VECTORS = json.loads((REPO / "tests/vectors/comment.json").read_text())["vectors"]
POLICY = load_policy(REPO / "examples/policy/teams.yaml")
GENERATED = 300  # comments through real sbatch (the lua5.1 unit test runs thousands)

#: Runs as the attacker: one sbatch per comment (argv, no shell), prints one JSON line per submission.
_SUBMITTER = r"""
import json, subprocess, sys
for c in json.load(sys.stdin):
    out = subprocess.run(["sbatch", "--parsable", "--hold", "-J", "nuro-cparse", "-D", "/tmp", "-o", "/dev/null",
                          "--gpus-per-node=1", "--comment=" + c, "--wrap", "true"], capture_output=True, text=True)
    print(json.dumps({"rc": out.returncode, "out": out.stdout, "err": out.stderr}), flush=True)
"""


def _submit_all(cluster: LiveCluster, comments: list[str]) -> list[dict]:
    """Submit every comment as the attacker, in one process (runuser once, sbatch per comment; comments on stdin)."""
    out = as_user(cluster, ATTACKER, [sys.executable, "-c", _SUBMITTER], stdin=json.dumps(comments))
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(rows) == len(comments), out.stderr[-2000:]
    return rows


def _disagreements(cluster: LiveCluster, comments: list[str], rows: list[dict]) -> list[str]:
    """Where real sbatch + the bridge and the Python preview differ; accepted jobs are read back and cancelled."""
    problems = []
    accepted = []
    for c, row in zip(comments, rows, strict=True):
        want = decide(JobRequest(user=ATTACKER, gpus_per_node=1, comment=c), POLICY)
        if want.accepted != (row["rc"] == 0):
            problems.append(f"sbatch rc={row['rc']} {row['err'].strip()!r} but decide says {want}: {c!r}")
            continue
        if not want.accepted:
            if f"sbatch: error: {want.message}\n" not in row["err"]:
                problems.append(f"message differs: {row['err']!r} vs {want.message!r}: {c!r}")
            continue
        accepted.append((c, int(row["out"].strip().split(";")[0])))
    by_id = {j.job_id: j for j in cluster.backend.jobs()}
    for c, job_id in accepted:
        stored = by_id[job_id].comment if job_id in by_id else cluster.backend.job_comment(job_id)
        # What Slurm stored is what every Python reader parses: it must mean what the bridge judged.
        if jobcomment.parse(stored).raw != jobcomment.parse(c).raw:
            problems.append(f"job {job_id}: Slurm stored {stored!r} for {c!r}: the readers would see another record")
    cluster.run(["scancel", "--name=nuro-cparse"], check=False)
    return problems


def _sendable(comment: str) -> bool:
    """What sbatch can carry in argv (no NUL) and Slurm stores as sent (no leading/trailing blanks it may trim)."""
    return "\x00" not in comment and len(comment.encode()) <= 8192


def test_shared_comment_vectors_through_real_sbatch(cluster: LiveCluster, guard: Guard) -> None:
    comments = [v["comment"] for v in VECTORS if _sendable(v["comment"])]
    assert len(comments) >= len(VECTORS) - 5
    rows = _submit_all(cluster, comments)
    problems = _disagreements(cluster, comments, rows)
    assert not problems, "\n".join(problems)


def test_escaped_or_duplicate_nuro_key_is_refused_not_misread(cluster: LiveCluster, guard: Guard) -> None:
    """The issue's attack: a record for the victim team hidden where a JSON library finds it and the bridge did not."""
    victim = {**luabridge.NURO, "team": VICTIM_TEAM}
    own = jobcomment.canonical(luabridge.NURO)
    attacks = {
        "escaped key": '{"nu\\u0072o":' + jobcomment.canonical(victim) + "}",
        "duplicate key": '{"nuro":' + own + ',"nuro":' + jobcomment.canonical(victim) + "}",
        "spaces": json.dumps({"nuro": victim}),
        "escaped value": '{"nuro":' + own.replace('"perception"', '"\\u0070erception"') + "}",
    }
    for name, comment in attacks.items():
        assert json.loads(comment)["nuro"]["team"] in (VICTIM_TEAM, "perception"), name  # a JSON library reads it
        assert jobcomment.parse(comment).raw == {}, name  # the one parser does not
    rows = _submit_all(cluster, list(attacks.values()))
    for (name, comment), row in zip(attacks.items(), rows, strict=True):
        assert row["rc"] != 0, f"{name}: sbatch accepted {row['out']}"
        assert "is not in the exact form nuro writes (" in row["err"] and "nuro-sbatch" in row["err"], row["err"]
        assert f"({jobcomment.scan(comment)})" in row["err"], (name, row["err"])


def test_generated_comments_through_real_sbatch(cluster: LiveCluster, guard: Guard) -> None:
    """A few hundred random and adversarial comments: bridge (real slurmctld) and Python agree on every one."""
    comments = [c for c in luabridge.comments(random.Random(1111), GENERATED * 2) if _sendable(c)][:GENERATED]
    assert len(comments) == GENERATED
    rows = _submit_all(cluster, comments)
    problems = _disagreements(cluster, comments, rows)
    refused = sum(row["rc"] != 0 for row in rows)
    print(f"comment-parse: {len(comments)} comments through real sbatch, {refused} refused, "
          f"{len(problems)} disagreements")  # fmt: skip
    assert 0 < refused < len(comments)
    assert not problems, f"{len(problems)} disagreements:\n" + "\n".join(problems[:20])


def test_modify_to_a_non_canonical_comment_is_refused(cluster: LiveCluster, guard: Guard) -> None:
    """scontrol update comment= by the job's owner: the same parser, the same refusal (reason in slurmctld's log)."""
    own = jobcomment.canonical({"nuro": luabridge.NURO})
    argv = ["sbatch", "--parsable", "--hold", "-J", "nuro-cparse", "-D", "/tmp", "-o", "/dev/null",
            "--gpus-per-node=1", f"--comment={own}", "--wrap", "true"]  # fmt: skip
    out = as_user(cluster, ATTACKER, argv)
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip().split(";")[0]
    try:
        forged = '{"nuro":' + jobcomment.canonical(luabridge.NURO) + ',"nu\\u0072o":{"team":"prediction"}}'
        res = as_user(cluster, ATTACKER, ["scontrol", "update", f"jobid={job}", f"comment={forged}"])
        assert res.returncode != 0 and "Access/permission denied" in res.stderr, res.stderr
        assert cluster.backend.job_comment(int(job)) == own
        log = (cluster.layout.log / "slurmctld.log").read_text(errors="replace")
        assert f"nuro: reject job_id={job}" in log and "rule=comment_not_canonical" in log
        ok = jobcomment.merge(own, note={"at": 1700000000, "step": 3})  # a key of the user's own beside the record
        assert as_user(cluster, ATTACKER, ["scontrol", "update", f"jobid={job}", f"comment={ok}"]).returncode == 0
        assert cluster.backend.job_comment(int(job)) == ok
    finally:
        cluster.run(["scancel", job], check=False)
