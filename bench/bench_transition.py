"""GPU-idle seconds per job transition on one node: the epilog waiting for a finished job's last checkpoint uploads
(before) vs handing them to the node agent (issue 15 item 6, ``nuro.checkpoint.handoff``), side by side in one run.

Each round: job A on gpu002 saves one final checkpoint of ``--mib`` MiB through the SDK and prints the time once
the save returned (its training is over); job B, queued right behind it for the same node (``--nodelist=gpu002
--exclusive``), prints the time as its first act. Idle = B's first line − A's "saved" line: A's ``close()``, the
epilog, Slurm's release of the node and B's start (prolog included). Three modes, round-robin:

* ``inline``: the SDK's default upload (a thread of the job): ``close()`` waits for the commit, the job holds the node;
* ``agent-epilog-waits``: ``upload="agent"``, hand-off off: the job exits at once, the epilog waits for the commit;
* ``agent-handoff``: ``upload="agent"``, ``NURO_EPILOG_HANDOFF=1``: the epilog hands the upload to the node agent.

The hand-off is switched by rewriting ``NURO_EPILOG_HANDOFF`` in the cluster's node env file (the hooks read it on
every run; the agents finish hand-offs either way). Also per round: when A's checkpoint was committed in S3,
counted from A's "saved" line.

    python -m bench.bench_transition [--rounds 2] [--mib 1024] [--port-base 30800]

Benchmarks measure; nothing asserts a speed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.common import cluster, save
from nuro.checkpoint import layout as L
from nuro.objectstore import ObjectStore
from nuro.protocol import jobcomment
from nuro.slurm import CliBackend, JobPhase

NODE = "gpu002"
TEAM = "root"  # the jobs run as root under account root: the bench's own cluster, no team users needed

_JOB_A = """#!/bin/bash
exec {python} - <<'PYEOF'
import time, torch
from nuro.wrappers.sdk.checkpointer import Checkpointer
ck = Checkpointer(upload="{upload}")
ck.save({{"w": torch.ones({floats})}}, 1, sync=True)
print("SAVED", time.time(), flush=True)
ck.close()
PYEOF
"""
_JOB_B = """#!/bin/bash
{python} -c 'import time; print("START", time.time(), flush=True)'
"""


def _set_handoff(env_file: Path, on: bool) -> None:
    lines = [ln for ln in env_file.read_text().splitlines() if not ln.startswith("NURO_EPILOG_HANDOFF=")]
    env_file.write_text("\n".join([*lines, *(["NURO_EPILOG_HANDOFF=1"] if on else [])]) + "\n")


def _value(path: Path, key: str) -> float:
    return float(next(ln.split()[1] for ln in path.read_text().splitlines() if ln.startswith(key)))


MODES = ("inline", "agent-epilog-waits", "agent-handoff")


def _round(backend: CliBackend, store: ObjectStore, work: Path, mib: int, mode: str) -> dict:
    run = f"tr-{uuid.uuid4().hex[:8]}"
    comment = jobcomment.merge(None, nuro={"v": 1, "name": run, "team": TEAM})
    common = ("--nodelist", NODE, "--exclusive", "--account", TEAM, "--time", "10")
    out_a, out_b = work / f"{run}-a.out", work / f"{run}-b.out"
    a = backend.submit(
        _JOB_A.format(python=sys.executable, floats=mib * (1 << 18), upload="inline" if mode == "inline" else "agent"),
        *common, "-o", str(out_a),
        f"--comment={comment}", f"--export=ALL,NURO_TEAM={TEAM},NURO_RUN_NAME={run}",
    )  # fmt: skip
    b = backend.submit(_JOB_B.format(python=sys.executable), *common, "-o", str(out_b), "--dependency", f"after:{a}")
    for job in (a, b):
        assert backend.wait_for_job(job, timeout_s=600).phase is JobPhase.COMPLETED, job
    end_a, start_b = _value(out_a, "SAVED"), _value(out_b, "START")
    key = L.manifest_key(TEAM, run, 1)
    t_wait = time.time()
    while not store.exists(key) and time.time() - t_wait < 300:
        time.sleep(0.2)
    committed_after = time.time() - end_a if store.exists(key) else None
    return {"mode": mode, "idle_s": round(start_b - end_a, 2), "committed": committed_after is not None,
            "committed_within_s": None if committed_after is None else round(committed_after, 2)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2, help="rounds per mode (round-robin)")
    p.add_argument("--mib", type=int, default=1024, help="size of job A's final checkpoint")
    p.add_argument("--port-base", type=int, default=30800)
    args = p.parse_args()
    with cluster(4, args.port_base, "transition") as (layout, env, _res):
        (layout.etc / "nuro_policy.lua").unlink(missing_ok=True)  # bridge in pass-through: plain sbatch records
        backend = CliBackend(env=env)
        store = ObjectStore.from_env(env)
        rows = []
        with tempfile.TemporaryDirectory(prefix="nuro-transition-", dir="/tmp") as tmp:
            work = Path(tmp)
            work.chmod(0o777)
            for _ in range(args.rounds):
                for mode in MODES:
                    _set_handoff(layout.nuro_env, mode == "agent-handoff")
                    rows.append(_round(backend, store, work, args.mib, mode))
                    print(rows[-1], flush=True)
        idle = {m: statistics.median(r["idle_s"] for r in rows if r["mode"] == m) for m in MODES}
        summary = {
            "mib": args.mib, "rounds": rows, "idle_s": idle,
            "ratio_inline_over_handoff": round(idle["inline"] / idle["agent-handoff"], 2),
            "ratio_epilog_waits_over_handoff": round(idle["agent-epilog-waits"] / idle["agent-handoff"], 2),
        }  # fmt: skip
    save("bench_transition", summary)


if __name__ == "__main__":
    main()
