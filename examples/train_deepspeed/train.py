"""The DeepSpeed example: a multi-agent trajectory model (Prediction-team style) trained with a ZeRO-2 engine.

Each scene holds 8 road users' last 1.2 s of positions; the model predicts every agent's next 0.8 s. Agents are
encoded one by one, then look at each other through self-attention (whose future depends on whom), and a head
decodes each agent's future displacements. The engine is DeepSpeed's (ZeRO stage 2: optimizer state and gradients
sharded across ranks), with the config the job was submitted with (``--deepspeed_config``, checked at submit).

What makes it survive is the same nuro SDK as the DDP example, a few lines each:
- data: ``SnapshotDataset``/``SnapshotLoader`` read exactly the pinned snapshot, in a world-size-independent order
  whose position is checkpointed;
- ``Checkpointer(engine=engine)``: DeepSpeed's own checkpoint files (the model states and every rank's ZeRO shard),
  copied in memory and written in the background to node-local staging, uploaded and committed by nuro; ``restore``
  loads the newest valid one, each node fetching only the model states and its own ranks' shards;
- ``PreemptionGuard``: on USR1/USR2 every rank stops at the same step, the engine is checkpointed and committed,
  rank 0 acknowledges, the job exits 75 (requeue me);
- ``MetricsLogger``: loss, ADE (average displacement error, metres) and samples/s per rank, never blocking a step.

    torchrun --nproc-per-node 2 train.py --deepspeed --deepspeed_config ds_zero2.json   # needs NURO_* env
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

if not torch.cuda.is_available():  # before DeepSpeed is imported: no accelerator probing on CPU nodes
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402 - after DS_ACCELERATOR

from nuro.lifecycle import run_events  # noqa: E402
from nuro.wrappers.sdk.checkpointer import Checkpointer  # noqa: E402
from nuro.wrappers.sdk.data import SnapshotDataset, SnapshotLoader  # noqa: E402
from nuro.wrappers.sdk.metrics import MetricsLogger  # noqa: E402
from nuro.wrappers.sdk.preemption import PreemptionGuard  # noqa: E402

AGENTS, PAST, FUTURE = 8, 12, 8


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300, help="total optimizer steps of the run")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--width", type=int, default=128, help="the model's hidden size")
    p.add_argument("--step-time", type=float, default=0.1, help="extra seconds per step (stands in for a big model)")
    p.add_argument("--progress-every-s", type=float, default=5.0, help="how often rank 0 records its step")
    deepspeed.add_config_arguments(p)  # --deepspeed --deepspeed_config PATH: what nuro's launcher passes
    return p.parse_args()


class TrajectoryModel(nn.Module):
    """Per-agent history encoder → self-attention across the scene's agents → per-agent future decoder."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.encode = nn.Sequential(nn.Linear(PAST * 2, width), nn.GELU(), nn.Linear(width, width))
        self.interact = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=2 * width, batch_first=True)
        self.decode = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, FUTURE * 2))

    def forward(self, past: torch.Tensor) -> torch.Tensor:
        """``past`` (batch, agents, PAST, 2), positions relative to each agent's last one → future offsets."""
        b, a = past.shape[:2]
        h = self.interact(self.encode(past.reshape(b, a, PAST * 2)))
        return self.decode(h).reshape(b, a, FUTURE, 2)


def decode(sample: dict[str, bytes]) -> torch.Tensor:
    """One scene file → (agents, PAST + FUTURE, 2), positions relative to each agent's last observed one."""
    (data,) = sample.values()
    track = torch.from_numpy(np.frombuffer(data, dtype="<f4").copy()).reshape(AGENTS, PAST + FUTURE, 2)
    return track - track[:, PAST - 1 : PAST]


def main() -> int:
    args = parse_args()
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    # our own process group with an explicit timeout (gloo's default is 30 min: a frozen peer would hang that long);
    # DeepSpeed uses the group that exists
    timeout = timedelta(seconds=float(os.environ.get("NURO_PG_TIMEOUT_S", "60")))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", timeout=timeout)
    rank = dist.get_rank()
    run_events.record_later("started", world=world, launcher="deepspeed")

    config_path = args.deepspeed_config or os.environ.get("NURO_DEEPSPEED_CONFIG")
    with open(config_path) as fh:
        config = json.load(fh)
    torch.manual_seed(0)
    model = TrajectoryModel(args.width)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    loader = SnapshotLoader(SnapshotDataset(transform=decode), engine.train_micro_batch_size_per_gpu())
    state = {"progress": {"step": 0}, "loader": loader.state_dict()}

    ckpt = Checkpointer(engine=engine)  # DeepSpeed's own files, staged, uploaded and committed by nuro
    t_restore = time.monotonic()
    restored = ckpt.restore(state)
    start = 0
    if restored is not None:
        loader.load_state_dict(state["loader"])
        start = restored + 1
        run_events.record_later(
            "restored", step=restored, seconds=round(time.monotonic() - t_restore, 3), copy=ckpt.restored_tier
        )
        if rank == 0:
            print(f"resumed from the checkpoint of step {restored}", flush=True)
    guard = PreemptionGuard().start()
    metrics = MetricsLogger()

    last_progress = 0.0
    step = start
    batches = loader.batches()
    for step in range(start, args.steps):
        scenes = next(batches)  # (batch, agents, PAST + FUTURE, 2)
        past, future = scenes[:, :, :PAST], scenes[:, :, PAST:]
        pred = engine(past)
        loss = nn.functional.smooth_l1_loss(pred, future)
        engine.backward(loss)
        engine.step()
        time.sleep(args.step_time)
        ade = (pred.detach() - future).norm(dim=-1).mean().item()
        state["progress"]["step"] = step
        state["loader"] = loader.state_dict()
        metrics.log(step, loss=loss.item(), ade_m=ade, samples=len(scenes), data_wait_s=loader.last_wait_s)
        if step == start:
            run_events.record_later("first_step", step=step)
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} ade {ade:.3f} m", flush=True)
            if time.monotonic() - last_progress >= args.progress_every_s:
                last_progress = time.monotonic()
                run_events.record_later("progress", step=step, loss=round(loss.item(), 5))
        ckpt.maybe_save(lambda: state, step)
        if guard.should_stop(step):  # every rank answers the same at the same step
            metrics.close(timeout_s=2.0)  # the steps before the stop show too (a sink that is down costs 2 s)
            guard.checkpoint_and_exit(lambda s=step: ckpt.save_committed(state, s), step)  # commit, then ack

    committed = ckpt.save_committed(state, step, timeout_s=120)
    ckpt.close()
    metrics.close()
    run_events.record("finished", step=step, committed=committed)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
