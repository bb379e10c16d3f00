"""Node health: Slurm's HealthCheckProgram and the node agent. Import as nuro.healthcheck."""
