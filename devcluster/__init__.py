"""The local multi-node Slurm cluster (many ``slurmd -N`` on one machine) that demo, tests and benchmarks use."""
