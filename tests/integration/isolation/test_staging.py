"""Attacks on the prolog's checkpoint staging, run as a team member (alice of perception) on the real cluster.

- a job whose comment names another team (or another team's run name) gets nothing of that team's checkpoints
  in its ``restore/``: root takes team and run only from the job's record (``nuro.protocol.jobrecord``: team = account);
- a watcher job swaps the ``restore/`` and step dirs of the member's next job for symlinks to a root-owned
  directory while the prolog stages: nothing outside the job changes owner or content;
- a running job of the same run leaves a FIFO and a ``/dev/zero`` link where the shards would be: the next job's
  prolog neither blocks nor reads them, and stages the checkpoint from S3.

The job_submit bridge is put in pass-through (no policy table) for this module, as in tests/integration/
test_prolog.py: these tests prove the prolog holds even for records the bridge would refuse.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import torch

from nuro.checkpoint import layout as L
from nuro.objectstore import ObjectStore
from nuro.protocol import jobcomment
from nuro.slurm import JobPhase
from nuro.wrappers.sdk.checkpointer import Checkpointer
from nuro.wrappers.sdk.runenv import RunEnv
from tests.integration.conftest import LiveCluster
from tests.integration.isolation.conftest import ATTACKER, ATTACKER_TEAM, VICTIM_TEAM, Guard, as_user

pytestmark = pytest.mark.slurm

NODE = "gpu006"


def _seed(store: ObjectStore, tmp: Path, team: str, run: str, mib: int = 4) -> int:
    """A committed checkpoint of ``team/run`` (step 1, ``mib`` MiB), written by root with the admin key."""
    ck = Checkpointer(team=team, run=run, store=store, staging_dir=tmp / "seed" / "9", upload="inline",
                      env=RunEnv(job_id=9))  # fmt: skip
    ck.save({"w": torch.full((mib * 256, 1024), 1.0)}, 1, sync=True)
    assert ck.wait_committed(1, 120)
    ck.close()
    return 1


def _comment(team: str, run: str) -> str:
    return jobcomment.merge(None, nuro={"v": 1, "name": run, "team": team})


def _sbatch(cluster: LiveCluster, out: Path, comment: str, script: str, *extra: str) -> int:
    res = as_user(
        cluster, ATTACKER,
        ["sbatch", "--parsable", "--nodes=1", f"--nodelist={NODE}", "--ntasks=1", "--cpus-per-task=1",
         f"--output={out}", f"--comment={comment}", *extra, "--wrap", script],
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip().split(";")[0])


def _listing_script(cluster: LiveCluster) -> str:
    """What a job sees in its restore dir (``NO-RESTORE-DIR`` when the prolog did not make one)."""
    restore = f"{_staging(cluster)}/$SLURM_JOB_ID/restore"
    return f'cd "{restore}" || {{ echo NO-RESTORE-DIR; exit 0; }}; find . -mindepth 1 | sort; echo LISTED'


def _staging(cluster: LiveCluster) -> Path:
    return Path(cluster.env["NURO_STAGING_ROOT"].replace("{node}", NODE))


@pytest.mark.parametrize("names", ["other-team", "other-team-run-name"])
def test_a_comment_naming_another_team_stages_nothing_of_it(
    cluster: LiveCluster, passthrough: None, guard: Guard, shared: Path, tmp_path: Path, names: str
) -> None:
    store = guard.store
    run = f"iso-{uuid.uuid4().hex[:6]}"
    _seed(store, tmp_path, VICTIM_TEAM, run)
    guard.watch_s3(L.run_prefix(VICTIM_TEAM, run))
    team = VICTIM_TEAM if names == "other-team" else ATTACKER_TEAM  # B's team, or A's team with B's run name
    out = shared / "job.out"
    job_id = _sbatch(cluster, out, _comment(team, run), _listing_script(cluster))
    job = cluster.backend.wait_for_job(job_id, timeout_s=180)
    text = out.read_text() if out.exists() else ""
    assert job.phase is JobPhase.COMPLETED, text
    assert "LISTED" in text and "NO-RESTORE-DIR" not in text, text
    assert "step-" not in text, f"the job got another team's checkpoint:\n{text}"


_WATCHER = r"""
me=$SLURM_JOB_ID; root={root}; target={target}
echo WATCHING
end=$((SECONDS+{seconds}))
while [ $SECONDS -lt $end ]; do
  for d in "$root"/*/; do
    id=$(basename "$d"); [ "$id" = "$me" ] && continue; [ -O "$d" ] || continue
    mv -f "$d/restore" "$d/r.$RANDOM" 2>/dev/null; ln -sfn "$target" "$d/restore" 2>/dev/null
    for s in "$d"/r.*/step-* "$d"/restore/step-*; do
      [ -d "$s" ] && [ ! -L "$s" ] && mv -f "$s" "$s.x$RANDOM" 2>/dev/null && ln -sfn "$target" "$s" 2>/dev/null
    done
    rm -f "$d/restore" 2>/dev/null; mkdir "$d/restore" 2>/dev/null
    ln -sfn "$target" "$d/restore/step-000000000001" 2>/dev/null
  done
done
echo WATCHED
"""


def test_a_watcher_swapping_restore_dirs_for_symlinks_harms_nothing_outside_the_job(
    cluster: LiveCluster, passthrough: None, guard: Guard, shared: Path, tmp_path: Path
) -> None:
    store = guard.store
    run = f"iso-{uuid.uuid4().hex[:6]}"
    _seed(store, tmp_path, ATTACKER_TEAM, run, mib=16)  # big enough to be mid-download while the watcher runs
    target = guard.canary.parent  # root-owned dir with the root-owned canary in it
    before = sorted(p.name for p in target.iterdir())
    watcher = _sbatch(
        cluster, shared / "watch.out", "", _WATCHER.format(root=_staging(cluster), target=target, seconds=40)
    )
    deadline = time.monotonic() + 30
    while "WATCHING" not in _read(shared / "watch.out") and time.monotonic() < deadline:
        time.sleep(0.5)
    victim = _sbatch(cluster, shared / "victim.out", _comment(ATTACKER_TEAM, run), _listing_script(cluster))
    job = cluster.backend.wait_for_job(victim, timeout_s=240)
    assert job.phase in (JobPhase.COMPLETED, JobPhase.FAILED), job
    cluster.backend.wait_for_job(watcher, timeout_s=120)
    assert sorted(p.name for p in target.iterdir()) == before, "root wrote into the symlinked target"
    st = target.stat()
    assert (st.st_uid, st.st_gid) == (0, 0), "the symlinked target changed owner"
    # the platform still stages for a job nobody attacks
    out = shared / "after.out"
    job = cluster.backend.wait_for_job(
        _sbatch(cluster, out, _comment(ATTACKER_TEAM, run), _listing_script(cluster)), timeout_s=180
    )
    assert job.phase is JobPhase.COMPLETED and "step-000000000001" in _read(out), _read(out)


_PLANTER = r"""
s="{root}/$SLURM_JOB_ID/ckpt/step-000000000001"; mkdir -p "$s"
for f in {files}; do mkdir -p "$(dirname "$s/$f")"; done
first=1
for f in {files}; do
  if [ $first = 1 ]; then mkfifo "$s/$f"; first=0; else ln -sfn /dev/zero "$s/$f"; fi
done
mkfifo "$s/.upload.done.json"
echo PLANTED; sleep {seconds}
"""


def test_a_fifo_and_a_dev_zero_link_in_another_job_of_the_run_never_block_the_prolog(
    cluster: LiveCluster, passthrough: None, guard: Guard, shared: Path, tmp_path: Path
) -> None:
    from nuro.checkpoint.restore import load_manifest

    store = guard.store
    run = f"iso-{uuid.uuid4().hex[:6]}"
    _seed(store, tmp_path, ATTACKER_TEAM, run)
    files = " ".join(e.path for e in load_manifest(store, ATTACKER_TEAM, run, 1).shards)
    planter = _sbatch(cluster, shared / "plant.out", _comment(ATTACKER_TEAM, run),
                      _PLANTER.format(root=_staging(cluster), files=files, seconds=90))  # fmt: skip
    deadline = time.monotonic() + 60
    while "PLANTED" not in _read(shared / "plant.out") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "PLANTED" in _read(shared / "plant.out")
    t0 = time.monotonic()
    out = shared / "next.out"
    job = cluster.backend.wait_for_job(
        _sbatch(cluster, out, _comment(ATTACKER_TEAM, run), _listing_script(cluster)), timeout_s=80
    )
    assert time.monotonic() - t0 < 80
    assert job.phase is JobPhase.COMPLETED and "step-000000000001" in _read(out), _read(out)
    cluster.run(["scancel", str(planter)], check=False)
    cluster.backend.wait_for_job(planter, timeout_s=120)
    assert not (_staging(cluster) / str(planter)).exists(), "the epilog left the planter's dir behind"


def _read(p: Path) -> str:
    try:
        return p.read_text()
    except OSError:
        return ""
