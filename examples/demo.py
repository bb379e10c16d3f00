"""`make demo`: a real 2-node DDP training run through nuro survives the loss of a node.
`make demo DEMO=deepspeed`: the same with a DeepSpeed ZeRO-2 engine (`examples/train_deepspeed`, multi-agent tracks).

1. bring up the local cluster (Slurm, SeaweedFS, one node agent per node, the controller's failure detector);
2. apply the team policy, snapshot the synthetic dataset, commit the example code to a throwaway git repository;
3. submit `examples/train_ddp/train.py` (or `examples/train_deepspeed/train.py` with its ZeRO-2 config) as alice
   (team perception) with `nuro-train submit` on 2 nodes;
4. once a checkpoint is committed, crash the second node (its slurmd, its job processes and its agent: SIGKILL);
5. the controller notices the silent node, sets it DOWN+DRAIN, Slurm requeues the job, it starts again on healthy
   nodes, restores the latest valid checkpoint and finishes;
6. print the run's timeline (`nuro-train events`) and bring the node back;
7. show what the run logged through MetricsLogger (`nuro-train metrics JOB --plot`): loss, samples/s and step time per
   rank, across the restart.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from rich.console import Console

from nuro.checkpoint.restore import latest_committed_step, load_manifest
from nuro.devcluster import manager, scenario
from nuro.devcluster.layout import DEFAULT_NODES, DEFAULT_PORT_BASE, Layout, default_state_dir
from nuro.objectstore import ObjectStore
from nuro.runs import report, timeline_report
from nuro.slurm import CliBackend, JobPhase

WORK = Path(os.environ.get("NURO_DEMO_DIR", "/tmp/nuro-demo"))
# The cluster's ports (``devcluster up --port-base``): another base lets the demo run beside another cluster.
PORT_BASE = int(os.environ.get("NURO_DEMO_PORT_BASE", str(DEFAULT_PORT_BASE)))
CKPT_INTERVAL_S = 4

out = Console(soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", choices=("ddp", "deepspeed"), default="ddp", help="which training job to run")
    deepspeed = parser.parse_args(argv).example == "deepspeed"
    layout = Layout(default_state_dir())
    out.print(f"[bold]1.[/] local cluster in {layout.root} (Slurm, SeaweedFS, node agents, failure detector)")
    res = manager.up(layout, DEFAULT_NODES, PORT_BASE)
    out.print("   already running" if res.already_running else f"   {res.nodes} nodes up: {res.seconds_to_idle:.1f} s")
    env = manager.env_exports(layout)
    backend = CliBackend(env=env)
    store = ObjectStore.from_env(env)

    out.print("[bold]2.[/] team policy, dataset snapshot, code commit")
    WORK.mkdir(parents=True, exist_ok=True)
    if deepspeed:
        dataset, repo = scenario.prepare(env, WORK, dataset="demo-tracks", example=scenario.DEEPSPEED_EXAMPLE)
    else:
        dataset, repo = scenario.prepare(env, WORK)
    out.print(f"   dataset {dataset}\n   code    {repo} (git)")

    how = f"DeepSpeed ZeRO-2 ({scenario.DEEPSPEED_CONFIG})" if deepspeed else "DDP"
    out.print(f"[bold]3.[/] nuro-train submit as alice: 2 nodes, {how} over gloo, checkpoint every {CKPT_INTERVAL_S} s")
    run = scenario.submit(env, WORK, dataset, repo, ckpt_interval_s=CKPT_INTERVAL_S, deepspeed=deepspeed)
    out.print(f"   job {run.job_id} ({run.name}); output {run.log}")

    def running():
        j = backend.find_job(run.job_id)
        return j if j is not None and j.phase == JobPhase.RUNNING else None

    job = scenario.wait_for("the job to start", running, 120)
    out.print(f"   running on {', '.join(job.nodes)}")
    step = scenario.wait_for("a committed checkpoint", lambda: latest_committed_step(store, run.team, run.name), 180)
    out.print(f"   checkpoint of step {step} committed")
    if deepspeed:
        files = ", ".join(s.path for s in load_manifest(store, run.team, run.name, step).shards)
        out.print(f"   its files (DeepSpeed's own: model states + each rank's ZeRO shard): {files}")

    victim = job.nodes[-1]
    time.sleep(2)  # a few more steps past the checkpoint, as in real life
    out.print(f"[bold]4.[/] crashing {victim}: SIGKILL its slurmd, its job processes and its node agent")
    scenario.kill_node(env, victim)

    out.print("[bold]5.[/] detection, requeue, restart on healthy nodes, restore, and the end of the run")
    final = backend.wait_for_job(run.job_id, timeout_s=400)
    out.print(f"   job {run.job_id} ended {final.state} after {final.restart_count} restart(s)")
    for line in run.log.read_text().splitlines():
        if "resumed from" in line:
            out.print(f"   [green]{line}[/]")

    out.print(f"[bold]6.[/] nuro-train events {run.job_id}")
    tl, notes = timeline_report.gather(run.job_id, backend, Path(env["NURO_EVENT_LOG"]), store)
    timeline_report.show(tl, notes)
    scenario.revive_node(env, victim)
    out.print(f"   {victim} revived; the controller returns it once its heartbeats are healthy again")
    out.print(f"[bold]7.[/] nuro-train metrics {run.job_id} --plot")
    _show_metrics(env, run.job_id, backend)
    _show_mlflow(env, run.job_id)
    out.print('plain Slurm tools work too:  eval "$(.venv/bin/nuro-admin devcluster env)"; squeue; sinfo')
    out.print("stop the cluster with:  make down")
    return 0 if final.phase == JobPhase.COMPLETED and final.restart_count >= 1 else 1


def _show_mlflow(env: dict[str, str], job_id: int) -> None:
    """The run in the cluster's MLflow UI (mirrored by nuro-mlflow-bridge): its URL, as ``nuro-train open`` prints."""
    if "MLFLOW_TRACKING_URI" not in env:
        return
    out.print(f"[bold]8.[/] the run in MLflow (nuro-train open {job_id})")
    try:
        found = scenario.wait_for("the run in MLflow", lambda: scenario.mlflow_url(env, job_id), 30)
    except scenario.ScenarioError as exc:
        out.print(f"   [yellow]not shown:[/] {exc}")
        return
    out.print(f"   {found}", highlight=False)


def _show_metrics(env: dict[str, str], job_id: int, backend: CliBackend) -> None:
    """The metrics view; a sink that cannot be read is a note, not a failed demo (the run itself survived)."""
    try:
        summary, plot = scenario.metrics_view(env, job_id, backend)
    except Exception as exc:  # noqa: BLE001 - the demo's point was made in steps 1-6
        out.print(f"   [yellow]metrics not shown:[/] {exc}")
        return
    out.print(report.render_metrics(summary))
    if plot:
        out.print(plot, highlight=False, markup=False)
    out.print(f"   {len(summary['history'])} points from {len(summary['ranks'])} ranks "
              f"(sink: {env.get('NURO_METRICS_URL') or 'embedded SQLite'})", highlight=False)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
