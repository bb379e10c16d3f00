"""Discrete-event trace replay of nuro's team scheduling against plain Slurm (``bench/bench_trace_replay.py``).

| module | what |
|---|---|
| ``trace`` | the Alibaba GPU trace (pods, nodes), the stratified cluster subset, the scaled teams policy |
| ``synth`` | what the trace lacks, from a seed: teams, gangs, tiers, checkpoint behaviour |
| ``slurm`` | a small Slurm-like scheduler: gang + whole-GPU placement on topology leaves, QOS limits, priority,
  backfill-lite |
| ``bridge`` | a ``nuro.slurm.Backend`` over the simulator, so the daemon's real controller cycle drives it |
| ``replay`` | the event loop, job lifecycles (checkpoints, preemption, requeue), run records |
| ``metrics`` | utilisation, alloc-idle, goodput, Jain fairness vs entitlement, quota checks, waits |
"""
