"""Login-node and in-job tools (nuro-train, nuro-sbatch, nuro-launch, the training SDK). Import as nuro.wrappers."""
