"""Kill → first step after resume: a hot spare swap vs the requeue path, the same 2-node DDP job, in the same run.

Each round submits the example training job (``nuro.devcluster.scenario``) on 2 nodes, once with ``--spare-nodes
1`` (3 nodes allocated with --no-kill: ``nuro-launch --step`` goes on with the spare) and once without (today's
path: nuro's detector sets the node DOWN, Slurm requeues, a new allocation starts, the training restores). Rounds
alternate so both see the same box. Once a checkpoint is committed, the second training node is crashed like a
host (``devcluster kill-node``) and the run's timeline (``nuro-train events``) gives each phase from the kill:
detect (controller's node_lost), restart (spare: the swap; requeue: the new attempt's start), restored, first step.

    python -m bench.bench_spares [--rounds 3] [--port-base 29400] [--slurm 22.05]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.common import cluster, p50, save
from nuro.checkpoint.restore import latest_committed_step
from nuro.devcluster import scenario
from nuro.objectstore import ObjectStore
from nuro.runs import timeline_report
from nuro.slurm import CliBackend, JobPhase

CKPT_INTERVAL_S = 4
PHASES = ("detect", "restart", "restored", "first_step")


def _round(env: dict[str, str], work: Path, dataset: str, repo: Path, spare: bool) -> dict:
    backend = CliBackend(env=env)
    store = ObjectStore.from_env(env)
    run = scenario.submit(env, work, dataset, repo, spare_nodes=1 if spare else 0, steps=150,
                          ckpt_interval_s=CKPT_INTERVAL_S)  # fmt: skip
    want = 3 if spare else 2

    def running():
        j = backend.find_job(run.job_id)
        return j if j is not None and j.phase == JobPhase.RUNNING and len(j.nodes) == want else None

    job = scenario.wait_for("the run to start", running, 180)
    scenario.wait_for("a committed checkpoint", lambda: latest_committed_step(store, run.team, run.name), 180)
    time.sleep(1.5)
    victim = job.nodes[1]
    t_kill = time.time()
    scenario.kill_node(env, victim)
    final = backend.wait_for_job(run.job_id, timeout_s=400)
    tl, _notes = timeline_report.gather(run.job_id, backend, Path(env["NURO_EVENT_LOG"]), store)
    rec = next((r for r in tl.recoveries if r.node == victim), None)

    def since(ts: float | None) -> float | None:
        return round(ts - t_kill, 2) if ts is not None else None

    restored = next((e.ts for e in tl.entries if e.kind == "resumed" and e.ts > t_kill), None)
    row = {
        "mode": "spare" if spare else "requeue",
        "job": run.job_id,
        "node": victim,
        "state": final.state,
        "restarts": final.restart_count,
        "detect": since(rec.detected) if rec else None,
        "restart": since(rec.restarted) if rec else None,
        "restored": since(restored),
        "first_step": since(rec.first_step) if rec else None,
        "steps_lost": rec.to_json()["steps_lost"] if rec else None,
    }
    scenario.revive_and_wait(env, victim)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds per mode (they alternate)")
    ap.add_argument("--port-base", type=int, default=29400)
    ap.add_argument("--slurm", default="22.05")
    args = ap.parse_args()
    rows: list[dict] = []
    with cluster(8, args.port_base, "spares", slurm=args.slurm) as (_layout, env, _up):
        work = Path(tempfile.mkdtemp(prefix="nuro-bench-spares-", dir="/tmp"))
        work.chmod(0o755)
        dataset, repo = scenario.prepare(env, work)
        time.sleep(4)  # the controller's restart grace has passed
        for i in range(2 * args.rounds):
            row = {"slurm": args.slurm, **_round(env, work, dataset, repo, spare=i % 2 == 0)}
            rows.append(row)
            print(f"{row['mode']} {i // 2 + 1}: {row}", flush=True)
    summary = {m: {k: p50([r for r in rows if r["mode"] == m], k) for k in (*PHASES, "steps_lost")}
               for m in ("spare", "requeue")}  # fmt: skip
    s, r = summary["spare"]["first_step"], summary["requeue"]["first_step"]
    save("spares", {
        "slurm": args.slurm, "ckpt_interval_s": CKPT_INTERVAL_S, "rounds": rows, "p50_seconds_from_kill": summary,
        "first_step_requeue_over_spare": round(r / s, 2) if r and s else None,
    })  # fmt: skip


if __name__ == "__main__":
    main()
