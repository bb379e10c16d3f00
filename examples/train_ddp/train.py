"""The demo's training job: a small MLP trained with DDP (gloo on CPU, NCCL on GPUs) on the pinned snapshot.

Everything that makes it survive is the nuro SDK, a few lines each:
- data: ``SnapshotDataset`` reads exactly the snapshot the job was submitted with (verified bytes, through the node's
  shard cache); ``SnapshotLoader`` deals it to the ranks in an order that does not depend on their number, and its
  position goes into the checkpoint, so a requeued or resized run continues with exactly the samples not yet seen;
- ``Checkpointer``: async checkpoints every ``NURO_CKPT_INTERVAL_S`` (snapshot in memory → node-local staging →
  background upload → manifest last), and ``restore`` of the newest valid one after a requeue;
- ``PreemptionGuard``: on USR1 (preemption) or USR2 (time limit) every rank stops at the same step, checkpoints,
  rank 0 acknowledges, and the job exits 75 ("requeue me");
- ``runevents``: started / restored / first step / progress / finished, for ``nuro-train events``;
- ``MetricsLogger``: every rank's loss, samples/s and step time to the metrics sink (``NURO_METRICS_URL``), never
  blocking a step, for ``nuro-train metrics JOB``.

    torchrun --nproc-per-node 2 train.py --steps 200      # locally (needs NURO_* env for data and checkpoints)
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from nuro.lifecycle import run_events
from nuro.wrappers.sdk.checkpointer import Checkpointer
from nuro.wrappers.sdk.data import SnapshotDataset, SnapshotLoader
from nuro.wrappers.sdk.metrics import MetricsLogger
from nuro.wrappers.sdk.preemption import PreemptionGuard
from nuro.wrappers.sdk.stragglers import MovePolicy, StragglerWatch


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300, help="total optimizer steps of the run")
    p.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--step-time", type=float, default=0.1, help="extra seconds per step (stands in for a big model)")
    p.add_argument("--progress-every-s", type=float, default=5.0, help="how often rank 0 records its step")
    p.add_argument("--loader-workers", type=int, default=0, help="DataLoader worker processes per rank")
    p.add_argument("--slow-rank", type=int, default=-1, help="this rank's stand-in compute is --slow-factor x longer")
    p.add_argument("--slow-factor", type=float, default=1.0,
                   help="a throttled GPU's slowdown, for --slow-rank / --slow-node")  # fmt: skip
    p.add_argument("--slow-node", default="", help="this node's ranks (SLURMD_NODENAME) are --slow-factor x slower")
    p.add_argument(
        "--burn",
        action="store_true",
        help="the stand-in compute spins the CPU instead of sleeping (a cgroup cpu quota then slows it)",
    )
    p.add_argument("--move-stragglers", action="store_true",
                   help="leave a straggler's node when moving pays (StragglerWatch with a MovePolicy)")  # fmt: skip
    p.add_argument("--sample-log", help="append 'restart step epoch indices' per step to PATH.rank<r> (tests)")
    return p.parse_args()


def decode(sample: dict[str, bytes]) -> torch.Tensor:
    """One sample (one ``rows/<i>.f32`` file) as a tensor of 16 features and the target."""
    (data,) = sample.values()
    return torch.from_numpy(np.frombuffer(data, dtype="<f4").copy())


def main() -> int:
    args = parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        # Explicit timeout: gloo's default is 30 min, so a frozen peer would hang the job that long.
        timeout = timedelta(seconds=float(os.environ.get("NURO_PG_TIMEOUT_S", "60")))
        dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank() if world > 1 else 0
    run_events.record_later("started", world=world)

    loader = SnapshotLoader(SnapshotDataset(transform=decode), args.batch, num_workers=args.loader_workers)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.SGD(net.parameters(), lr=args.lr)
    state = {"model": model.state_dict(), "progress": {"step": 0}, "loader": loader.state_dict()}

    ckpt = Checkpointer()
    t_restore = time.monotonic()
    restored = ckpt.restore(state)
    start = 0
    if restored is not None:
        model.load_state_dict(state["model"])
        loader.load_state_dict(state["loader"])
        start = restored + 1
        run_events.record_later(
            "restored", step=restored, seconds=round(time.monotonic() - t_restore, 3), copy=ckpt.restored_tier
        )
        if rank == 0:
            print(f"resumed from the checkpoint of step {restored}", flush=True)
    guard = PreemptionGuard().start()  # handlers for USR1 (preemption) and USR2 (time limit)
    metrics = MetricsLogger()  # never blocks a step; a sink that is down costs points, not the run
    # which rank holds the job back, per 20 steps; with --move-stragglers, leave its node when that pays
    move = MovePolicy(guard, checkpoint_s=ckpt.save_seconds) if args.move_stragglers else None
    watch = StragglerWatch(move=move).attach(net) if world > 1 else None
    slow = rank == args.slow_rank or (args.slow_node and os.environ.get("SLURMD_NODENAME") == args.slow_node)
    compute_s = args.step_time * (args.slow_factor if slow else 1.0)
    saved = False

    last_progress = 0.0
    step = start
    batches = loader.batches()
    for step in range(start, args.steps):
        rows = next(batches)  # (batch, 17): this rank's share of the global order
        loss = nn.functional.mse_loss(net(rows[:, :-1]).squeeze(1), rows[:, -1])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.burn:  # a fixed amount of CPU work: a throttled node (devcluster's throttle_node) takes longer
            spin_until = time.thread_time() + compute_s
            while time.thread_time() < spin_until:
                pass
        else:
            time.sleep(compute_s)
        state["progress"]["step"] = step
        state["loader"] = loader.state_dict()  # after the step that used the batch: a resume continues after it
        if watch is not None:  # a step after a checkpoint save is left out of the straggler measure
            watch.observe(data_wait_s=loader.last_wait_s, skip=saved, steps_left=args.steps - step - 1)
        extra = watch.fields() if watch is not None else {}
        metrics.log(step, loss=loss.item(), samples=len(rows), data_wait_s=loader.last_wait_s, **extra)
        if args.sample_log:
            with open(f"{args.sample_log}.rank{rank}", "a") as fh:
                fh.write(f"{ckpt.env.restart_count} {step} {','.join(map(str, loader.last_indices))}\n")
        if step == start:
            run_events.record_later("first_step", step=step)
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
            if time.monotonic() - last_progress >= args.progress_every_s:
                last_progress = time.monotonic()
                run_events.record_later("progress", step=step, loss=round(loss.item(), 5))
        saved = ckpt.maybe_save(lambda: state, step)
        if guard.should_stop(step):  # every rank answers the same at the same step
            metrics.close(timeout_s=2.0)  # the steps before the stop show too (a sink that is down costs 2 s)
            guard.checkpoint_and_exit(lambda s=step: ckpt.save_committed(state, s), step)  # commit, then ack

    committed = ckpt.save_committed(state, step, timeout_s=120)
    ckpt.close()
    metrics.close()
    run_events.record("finished", step=step, committed=committed)
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
