"""A run as people follow it from a login node, assembled from the systems of record (Slurm, S3, the metrics sink).

The views ``nuro-train`` prints live here, not in the CLI modules, because the dev wing, the demo, the benches and
the tests read them too: ``checkpoints`` (a run's committed checkpoints and its ``resume_from`` lineage), ``report``
(what a run logged and stored, and how two runs differ), ``timeline_report`` (a run's lifecycle from every source).
The CLIs in ``login/`` only parse flags, call these and print.
"""
