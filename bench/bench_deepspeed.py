"""DeepSpeed jobs (issue 17): the checkpoint stall of a ZeRO-2 engine, and resume after a node loss vs the DDP job.

``--part stall`` (no cluster; 2 gloo ranks on this box, each its own node's staging dir, SeaweedFS on loopback): a
ZeRO-2 engine of ``--layers`` × ``--hidden``² fp32 parameters with AdamW, in one run and on the same engine:

- baseline ``deepspeed_sync_stall_s``: DeepSpeed's own ``engine.save_checkpoint`` (its torch.save engine), what a
  DeepSpeed job blocks today, per save;
- baseline ``clone_s``: copying the engine's files' state in memory (the least an asynchronous save can block);
- nuro ``Checkpointer(engine=engine).save``: ``stall_s`` (what the training blocks: the copy), ``durable_s`` (every
  rank's files written on the node), ``committed_s`` (the manifest in S3, inline upload);
- ratio ``sync_over_async`` (DeepSpeed's stall over nuro's).

``--part resume`` (one 8-node cluster): the scenario of ``bench/bench_resume.py`` (a node of the 2-node job crashed
after a committed checkpoint, phases from the kill), alternating the DDP example and the DeepSpeed example, nuro's
path for both; ratio ``first_step_deepspeed_over_ddp`` and the restore phase of each.

    python -m bench.bench_deepspeed [--part stall|resume|both] [--rounds 3] [--layers 6 --hidden 2048]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.common import REPO, RESULTS, cluster, p50, save

STALL_PORT_BASE = 9300
RESUME_PORT_BASE = 29800

_WORKER = r"""
import json, os, sys, time, statistics, torch, torch.distributed as dist
from datetime import timedelta
from pathlib import Path
os.environ.setdefault("DS_ACCELERATOR", "cpu")
rank_args = json.loads(sys.argv[1])

def main(rank, a):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a["port"]), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK=str(rank), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=300))
    import deepspeed, logging
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    from nuro.devcluster import s3
    from nuro.devcluster.layout import PortPlan
    from nuro.wrappers.sdk.checkpointer import Checkpointer
    from nuro.wrappers.sdk.dsengine import snapshot
    torch.manual_seed(0)
    layers = [torch.nn.Linear(a["hidden"], a["hidden"]) for _ in range(a["layers"])]
    model = torch.nn.Sequential(*layers)
    cfg = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2},
           "zero_allow_untested_optimizer": True, "checkpoint": {"use_node_local_storage": True},
           "steps_per_print": 10**9}
    eng, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4), config=cfg)
    def step():
        x = torch.randn(4, a["hidden"])
        loss = eng(x).pow(2).mean()
        eng.backward(loss)
        eng.step()
    step()
    root = Path(a["work"]) / f"node{rank}"
    sync = []
    for i in range(a["saves"]):  # DeepSpeed's own synchronous save (its torch.save engine)
        dist.barrier()
        t0 = time.perf_counter()
        eng.save_checkpoint(str(root / "plain"), tag=f"s{i}", save_latest=False)
        sync.append(time.perf_counter() - t0)
        step()
    t0 = time.perf_counter()
    copies = snapshot({"o": eng.optimizer.state_dict(), "m": eng.module_state_dict()})
    clone = time.perf_counter() - t0
    del copies
    shutil_dir = root / "plain"
    import shutil; shutil.rmtree(shutil_dir, ignore_errors=True)
    store = s3.dev_store(PortPlan(a["s3_port"]))
    ck = Checkpointer(team="prediction", run=a["run"], store=store, staging_dir=root / "stage" / "700",
                      upload="inline", engine=eng)
    state = {"progress": {"step": 0}}
    committed = []
    for i in range(1, a["saves"] + 1):
        dist.barrier()
        t0 = time.perf_counter()
        ck.save(state, i)
        step()  # training goes on while the files are written
        ok = ck.wait_committed(i, 300)
        committed.append(time.perf_counter() - t0 if ok else None)
    ck.close()
    if rank == 0:
        t = ck.timings
        out = {"deepspeed_sync_stall_s": [round(v, 3) for v in sync], "clone_s": round(clone, 3),
               "stall_s": [round(t[i]["stall_s"], 3) for i in sorted(t)],
               "durable_s": [round(t[i]["durable_s"], 3) for i in sorted(t)],
               "committed_s": [round(v, 3) if v else None for v in committed]}
        Path(a["out"]).write_text(json.dumps(out))
    dist.destroy_process_group()

if __name__ == "__main__":
    import torch.multiprocessing as mp
    mp.spawn(main, args=(rank_args,), nprocs=2, join=True)
"""


def stall(args: argparse.Namespace) -> dict:
    from nuro.devcluster import s3  # lazy: the resume part does not need it

    work = Path(tempfile.mkdtemp(prefix="nuro-bench-ds-"))
    state = work / "s3"
    try:
        with s3.standalone(state, STALL_PORT_BASE):
            script = work / "worker.py"
            script.write_text(_WORKER)
            out = work / "out.json"
            a = {"port": 29650, "hidden": args.hidden, "layers": args.layers, "saves": args.saves, "work": str(work),
                 "s3_port": STALL_PORT_BASE, "run": f"bench-{uuid.uuid4().hex[:6]}", "out": str(out)}  # fmt: skip
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            res = subprocess.run([sys.executable, str(script), json.dumps(a)], env=env, capture_output=True,
                                 text=True, timeout=1800)  # fmt: skip
            if res.returncode != 0:
                raise SystemExit(res.stderr[-4000:])
            got = json.loads(out.read_text())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    params = args.layers * (args.hidden * args.hidden + args.hidden)
    sync_p50 = statistics.median(got["deepspeed_sync_stall_s"])
    async_p50 = statistics.median(got["stall_s"])
    return {
        "params": params,
        "ranks": 2,
        **got,
        "p50": {
            "deepspeed_sync_stall_s": round(sync_p50, 3),
            "nuro_stall_s": round(async_p50, 3),
            "nuro_durable_s": round(statistics.median(got["durable_s"]), 3),
            "nuro_committed_s": p50([{"v": v} for v in got["committed_s"]], "v"),
        },  # fmt: skip
        "sync_over_async": round(sync_p50 / async_p50, 2) if async_p50 else None,
    }


def resume(args: argparse.Namespace) -> dict:
    from bench.bench_resume import PHASES, _round  # lazy: pulls the cluster plumbing
    from nuro.devcluster import scenario

    rows: list[dict] = []
    with cluster(8, RESUME_PORT_BASE, "deepspeed") as (layout, env, _up):
        work = Path(tempfile.mkdtemp(prefix="nuro-bench-ds-resume-", dir="/tmp"))
        work.chmod(0o755)
        prepared = {
            False: scenario.prepare(env, work / "ddp"),
            True: scenario.prepare(
                env, work / "ds", dataset="demo-tracks", example=scenario.DEEPSPEED_EXAMPLE, apply_policy=False
            ),  # fmt: skip
        }
        time.sleep(4)  # the controller's restart grace has passed
        for i in range(2 * args.rounds):
            ds = i % 2 == 1
            dataset, repo = prepared[ds]
            row = {**_round(layout, env, work / ("ds" if ds else "ddp"), dataset, repo, True, deepspeed=ds),
                   "job_kind": "deepspeed" if ds else "ddp"}  # fmt: skip
            rows.append(row)
            print(f"resume {row['job_kind']} {i // 2 + 1}: {row}", flush=True)
    summary = {
        kind: {k: p50([r for r in rows if r["job_kind"] == kind], k) for k in (*PHASES, "lost_steps", "lost_s")}
        for kind in ("ddp", "deepspeed")
    }
    d, s = summary["ddp"]["first_step"], summary["deepspeed"]["first_step"]
    return {"rounds": rows, "p50_seconds_from_kill": summary,
            "first_step_deepspeed_over_ddp": round(s / d, 2) if d and s else None}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("stall", "resume", "both"), default="both")
    ap.add_argument("--rounds", type=int, default=3, help="resume: crashes of each job")
    ap.add_argument("--layers", type=int, default=6, help="stall: Linear layers of the model")
    ap.add_argument("--hidden", type=int, default=2048, help="stall: their width")
    ap.add_argument("--saves", type=int, default=3, help="stall: saves of each kind")
    args = ap.parse_args()
    result: dict = {}
    if args.part in ("stall", "both"):
        result["stall"] = stall(args)
        print("stall:", json.dumps(result["stall"]["p50"]), "sync_over_async", result["stall"]["sync_over_async"])
    if args.part in ("resume", "both"):
        result["resume"] = resume(args)
        print("resume:", json.dumps(result["resume"]["p50_seconds_from_kill"]))
    earlier = RESULTS / "deepspeed.json"  # one part run alone keeps the other part's last result
    if args.part != "both" and earlier.exists():
        result = {**{k: v for k, v in json.loads(earlier.read_text()).items() if k in ("stall", "resume")}, **result}
    save("deepspeed", result)


if __name__ == "__main__":
    main()
