"""Failure detection: kill → node DOWN in Slurm, nuro's heartbeat detector vs Slurm alone, in the same run.

Each round crashes one emulated node like a host (``devcluster kill-node``: slurmd, slurmstepds, job processes and
node agent, SIGKILL) while a ``--requeue`` sleep job runs on it, then measures by polling Slurm every ~0.1 s:

* detect: kill → the node is DOWN in Slurm (nuro mode: DOWN with a ``nuro:`` reason; baseline: DOWN by Slurm's
  SlurmdTimeout path, any reason);
* requeued: kill → the job is PENDING again (requeued);
* running again: kill → the job RUNNING on another node (requeue delay = cred_expire + 1 s, then scheduling).

Baseline (Slurm alone): the dev cluster's ``nuro-controller`` is paused (SIGSTOP, by its recorded PID) so only
SlurmdTimeout detects; agents keep beating into the paused socket. The ratio is baseline p50 / nuro p50.

Nodes are rotated so no node loses more than 2 heartbeats in 10 minutes (3 would be flapping and held drained).
The job is submitted excluding every node but the planned victim and one spare, so it lands on one of the two and
is requeued onto the other (the node it landed on is the one killed).

Per Slurm version with ``--slurm 22.05 26.05`` (one cluster after the other): each version's p50/p99 and ratio.

    python -m bench.bench_detection [--kills 20] [--baseline-kills 4] [--nodes 16] [--port-base 28800] [--slurm V...]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import time

import psutil

from bench.common import cluster, poll, save
from nuro.devcluster import manager
from nuro.devcluster.layout import Layout, node_names
from nuro.devcluster.record import read_record
from nuro.protocol.heartbeat import DEFAULT_INTERVAL_S, DEFAULT_MISS_LIMIT
from nuro.slurm import CliBackend

SLEEP_JOB = "#!/bin/bash\nsleep 3600\n"


def _q(argv: list[str], env: dict[str, str]) -> str:
    res = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=30, check=False)
    return res.stdout.strip()


def _node_state(env: dict[str, str], node: str) -> tuple[str, str]:
    """(state with flags as sinfo %T shows it, reason)."""
    out = _q(["scontrol", "show", "-o", "node", node], env)
    fields = dict(kv.split("=", 1) for kv in out.split() if "=" in kv)
    reason = out.split("Reason=", 1)[1] if "Reason=" in out else ""
    return fields.get("State", ""), reason


def _job(env: dict[str, str], job_id: int) -> tuple[str, str]:
    out = _q(["squeue", "-h", "-j", str(job_id), "-o", "%T|%N"], env)
    state, _, nodes = out.partition("|")
    return state, nodes


_wait = poll


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return round(s[lo] + (s[hi] - s[lo]) * (k - lo), 2)


def _controller(layout: Layout) -> psutil.Process:
    rec = read_record(layout.record)
    ref = next(d for d in rec.daemons if d.name == "nuro-controller") if rec else None
    proc = ref.process() if ref else None
    if proc is None:
        raise RuntimeError("the dev cluster's nuro-controller is not running")
    return proc


def _round(layout: Layout, env: dict[str, str], backend: CliBackend, victim: str, spare: str, nuro: bool) -> dict:
    allowed = {victim, spare}
    exclude = ",".join(n for n in node_names(len(backend.nodes())) if n not in allowed)
    job_id = backend.submit(SLEEP_JOB, "--requeue", "-N1", f"--exclude={exclude}", "-o", "/dev/null")
    landed = _wait(lambda: (s := _job(env, job_id))[0] == "RUNNING" and s[1], 60)
    if not landed:
        raise RuntimeError(f"job {job_id} did not start")
    victim = landed
    spare = (allowed - {victim}).pop()
    time.sleep(1.5)  # the agent beats at least once with the job running
    killed = manager.kill_node(layout, victim)
    t_kill = killed["at"]
    marks: dict[str, float] = {}
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not ("detect" in marks and "running_again" in marks):
        now = time.time()
        if "detect" not in marks:
            state, reason = _node_state(env, victim)
            if "DOWN" in state and (reason.startswith("nuro:") or not nuro):
                marks["detect"] = now - t_kill
                marks["reason"] = reason  # type: ignore[assignment]
        jstate, jnodes = _job(env, job_id)
        if "requeued" not in marks and jstate in ("PENDING", "REQUEUED", "REQUEUE_HOLD"):
            marks["requeued"] = now - t_kill
        if "requeued" in marks and "running_again" not in marks and jstate == "RUNNING" and jnodes != victim:
            marks["running_again"] = now - t_kill
            marks["ran_on"] = jnodes  # type: ignore[assignment]
        time.sleep(0.1)
    _q(["scancel", str(job_id)], env)
    revived = manager.revive_node(layout, victim)
    back = _wait(lambda: _node_state(env, victim)[0] == "IDLE", 60, 0.2)
    return {
        "mode": "nuro" if nuro else "slurm_alone",
        "node": victim,
        "job": job_id,
        "detect_s": round(marks["detect"], 2) if "detect" in marks else None,
        "requeued_s": round(marks["requeued"], 2) if "requeued" in marks else None,
        "running_again_s": round(marks["running_again"], 2) if "running_again" in marks else None,
        "reason": marks.get("reason"),
        "revive_to_idle_s": round(time.time() - revived["at"], 2) if back else None,
    }


def _summary(rows: list[dict]) -> dict:
    out = {"kills": len(rows)}
    for key in ("detect_s", "requeued_s", "running_again_s", "revive_to_idle_s"):
        xs = [r[key] for r in rows if r[key] is not None]
        out[key] = {"p50": _pct(xs, 0.5), "p99": _pct(xs, 0.99), "max": max(xs, default=None), "n": len(xs)}
        if xs:
            out[key]["mean"] = round(statistics.mean(xs), 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--baseline-kills", type=int, default=4)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--port-base", type=int, default=28800)
    ap.add_argument("--slurm", nargs="+", default=["22.05"], help="Slurm versions, one cluster each [22.05]")
    args = ap.parse_args()
    results = {version: _measure(args, version) for version in args.slurm}
    if len(results) == 1:
        (only,) = results.values()
        save("detection", only)
    else:
        save("detection", {"nodes": args.nodes, "by_slurm": results})


def _measure(args: argparse.Namespace, version: str) -> dict:
    """Every round on one cluster of Slurm ``version``; the summary ``save`` writes for it."""
    with cluster(args.nodes, args.port_base, "detection", slurm=version) as (layout, env, _up):
        backend = CliBackend(env=env)
        names = node_names(args.nodes)
        losses = dict.fromkeys(names, 0)
        rows: list[dict] = []
        time.sleep(4)  # the controller's restart grace (miss_limit intervals) has passed

        def pick() -> tuple[str, str]:
            order = sorted(names, key=lambda n: (losses[n], names.index(n)))
            return order[0], order[1]

        for i in range(args.kills):
            victim, spare = pick()
            row = _round(layout, env, backend, victim, spare, nuro=True)
            losses[row["node"]] += 1
            rows.append(row)
            print(f"nuro {i + 1}/{args.kills}: {row}", flush=True)
        ctl = _controller(layout)
        ctl.send_signal(signal.SIGSTOP)  # Slurm alone: the detector is paused, SlurmdTimeout decides
        try:
            for i in range(args.baseline_kills):
                victim, spare = pick()
                row = _round(layout, env, backend, victim, spare, nuro=False)
                losses[row["node"]] += 1
                rows.append(row)
                print(f"slurm alone {i + 1}/{args.baseline_kills}: {row}", flush=True)
        finally:
            ctl.send_signal(signal.SIGCONT)
        config = _q(["scontrol", "show", "config"], env)
        conf = {
            k: v
            for line in config.splitlines()
            if "=" in line
            for k, v in [map(str.strip, line.split("=", 1))]
            if k in ("SlurmdTimeout", "MessageTimeout", "AuthInfo")
        }
    nuro_rows = [r for r in rows if r["mode"] == "nuro"]
    base_rows = [r for r in rows if r["mode"] == "slurm_alone"]
    nuro_s, base_s = _summary(nuro_rows), _summary(base_rows)
    ratio = (
        round(base_s["detect_s"]["p50"] / nuro_s["detect_s"]["p50"], 2)
        if nuro_s["detect_s"]["n"] and base_s["detect_s"]["n"]
        else None
    )
    return {
        "nodes": args.nodes,
        "slurm_version": version,
        "heartbeat": {"interval_s": DEFAULT_INTERVAL_S, "miss_limit": DEFAULT_MISS_LIMIT, "detector_tick_s": 0.25},
        "slurm": conf,
        "nuro": nuro_s,
        "slurm_alone": base_s,
        "detect_p50_slurm_alone_over_nuro": ratio,
        "rows": rows,
    }


if __name__ == "__main__":
    main()
