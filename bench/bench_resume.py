"""Resume after a node loss, broken down, for a real 2-node DDP run: nuro vs Slurm alone, in the same run.

Each round is the demo's scenario (``nuro.devcluster.scenario``): the example training job on 2 nodes checkpoints
every few seconds; once one checkpoint is committed and a few more steps ran, one of its nodes is crashed like a
host (``devcluster kill-node``). Every phase is measured from the kill:

* detect: the node is declared lost (nuro: the controller's ``node_lost`` event; Slurm alone: the requeue itself);
* requeue: the attempt's end in accounting (sacct, 1 s resolution);
* eligible: the requeued job may start (requeue + cred_expire + 1 s);
* start: the new attempt runs (allocation);
* process: the training processes are up and their DDP group formed (run event ``started``);
* restored: the newest valid checkpoint is loaded (run event ``restored``, with its own seconds = stage/load);
* first step: the first training step after the restore (run event ``first_step``);
* lost: training steps done before the crash that were done again (from rank 0's log), and their seconds.

Slurm alone = the controller paused (SIGSTOP by its recorded PID) for the round: only SlurmdTimeout notices.

Per Slurm version (``--slurm 22.05,26.05``: one cluster after the other, same job, same box): 25.11+ gets the job
submitted with ``--requeue=expedite`` and ``enable_expedited_requeue``, so the requeued job is eligible at once
instead of ``cred_expire + 1`` s later; the summary gives each version's phases and the ratio of first-step times.

    python -m bench.bench_resume [--rounds 3] [--baseline-rounds 1] [--port-base 28800] [--slurm 22.05,26.05]
"""

from __future__ import annotations

import argparse
import signal
import tempfile
import time
from pathlib import Path

from bench.bench_detection import _controller
from bench.common import cluster, p50, save
from nuro.checkpoint.restore import latest_committed_step
from nuro.devcluster import scenario
from nuro.objectstore import ObjectStore
from nuro.runs import timeline_report
from nuro.slurm import CliBackend, JobPhase

CKPT_INTERVAL_S = 4
PHASES = ("detect", "requeue", "eligible", "start", "process", "restored", "first_step")


def _round(
    layout, env: dict[str, str], work: Path, dataset: str, repo: Path, nuro: bool, deepspeed: bool = False
) -> dict:
    """One crash of one of the example job's 2 nodes (the DeepSpeed example with ``deepspeed``), phases from the
    kill; ``nuro`` False pauses the controller (Slurm alone)."""
    backend = CliBackend(env=env)
    store = ObjectStore.from_env(env)
    run = scenario.submit(env, work, dataset, repo, steps=150, ckpt_interval_s=CKPT_INTERVAL_S, deepspeed=deepspeed)

    def running():
        j = backend.find_job(run.job_id)
        return j if j is not None and j.phase == JobPhase.RUNNING and len(j.nodes) == 2 else None

    job = scenario.wait_for("the run to start", running, 180)
    scenario.wait_for("a committed checkpoint", lambda: latest_committed_step(store, run.team, run.name), 180)
    time.sleep(1.5)
    victim = job.nodes[-1]
    ctl = None if nuro else _controller(layout)
    if ctl is not None:
        ctl.send_signal(signal.SIGSTOP)
    try:
        t_kill = time.time()
        scenario.kill_node(env, victim)
        scenario.wait_for(
            "the restart", lambda: (j := backend.find_job(run.job_id)) is not None and j.restart_count >= 1, 240
        )
    finally:
        if ctl is not None:
            ctl.send_signal(signal.SIGCONT)
    final = backend.wait_for_job(run.job_id, timeout_s=400)
    tl, _notes = timeline_report.gather(run.job_id, backend, Path(env["NURO_EVENT_LOG"]), store)

    def first(kind: str, attempt: int) -> float | None:
        e = next((e for e in tl.entries if e.kind == kind and e.attempt == attempt), None)
        return round(e.ts - t_kill, 2) if e else None

    lost_event = first("node_lost", 0)
    requeue = first("requeued", 0) or first("node_fail", 0)
    row = {
        "mode": "nuro" if nuro else "slurm_alone",
        "job": run.job_id,
        "node": victim,
        "state": final.state,
        "detect": lost_event if nuro and lost_event is not None else requeue,
        "requeue": requeue,
        "eligible": first("eligible", 1),
        "start": first("restarted", 1),
        "process": first("process_started", 1),
        "restored": first("resumed", 1),
        "first_step": first("first_step", 1),
    }
    log = run.log.read_text().splitlines()
    resumed = next((n for n, line in enumerate(log) if "resumed from the checkpoint of step" in line), None)
    if resumed is not None:
        restored = int(log[resumed].rsplit(" ", 1)[1])
        before = [s for n, s in scenario.steps_logged(run.log) if n < resumed]
        progress = [e for e in tl.entries if e.kind == "progress" and e.attempt == 0 and e.step is not None]
        rate = (progress[-1].step - progress[0].step) / max(1e-9, progress[-1].ts - progress[0].ts)
        row["lost_steps"] = max(before) - restored
        row["lost_s"] = round(row["lost_steps"] / rate, 2) if rate > 0 else None
    scenario.revive_and_wait(env, victim)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline-rounds", type=int, default=1)
    ap.add_argument("--port-base", type=int, default=28800)
    ap.add_argument("--slurm", default="22.05", help="comma-separated Slurm versions, one cluster each (22.05,26.05)")
    args = ap.parse_args()
    rows: list[dict] = []
    versions = [v.strip() for v in args.slurm.split(",") if v.strip()]
    for version in versions:
        with cluster(8, args.port_base, "resume", slurm=version) as (layout, env, _up):
            work = Path(tempfile.mkdtemp(prefix="nuro-bench-resume-", dir="/tmp"))
            work.chmod(0o755)
            dataset, repo = scenario.prepare(env, work)
            time.sleep(4)  # the controller's restart grace has passed
            for i in range(args.rounds + args.baseline_rounds):
                nuro = i < args.rounds
                row = {"slurm": version, **_round(layout, env, work, dataset, repo, nuro)}
                rows.append(row)
                print(f"{version} {row['mode']} {i + 1}: {row}", flush=True)
    by_version = {}
    for version in versions:
        mine = [r for r in rows if r["slurm"] == version]
        summary = {
            mode: {k: p50([r for r in mine if r["mode"] == mode], k) for k in (*PHASES, "lost_steps", "lost_s")}
            for mode in ("nuro", "slurm_alone")
        }
        n, b = summary["nuro"]["first_step"], summary["slurm_alone"]["first_step"]
        by_version[version] = {**summary, "first_step_slurm_alone_over_nuro": round(b / n, 2) if n and b else None}
    result: dict = {"ckpt_interval_s": CKPT_INTERVAL_S, "rounds": rows, "p50_seconds_from_kill": by_version}
    if len(versions) == 2:  # the older over the newer: > 1 means the newer Slurm resumes faster
        old, new = (by_version[v]["nuro"]["first_step"] for v in versions)
        result[f"first_step_{versions[0]}_over_{versions[1]}"] = round(old / new, 2) if old and new else None
    save("resume", result)


if __name__ == "__main__":
    main()
