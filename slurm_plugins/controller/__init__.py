"""nuro-controller: borrowing, reclaim, tiers and fair share around Slurm.

Pure core, thin edges (architecture principle 3): ``engine.decide`` computes decisions from one snapshot (no I/O);
the daemon reads snapshots and applies the decisions. Engine modules, in pipeline order: ``classify`` (phase 1),
``preemption`` (2–4, with ``victims`` and ``capacity``), ``borrowing`` (5), ``fairshare`` (6); values in
``decisions`` and ``cycle``.
"""
