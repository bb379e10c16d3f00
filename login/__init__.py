"""Login-node CLIs (``nuro-train``, ``nuro-sbatch``). Import as nuro.login."""
