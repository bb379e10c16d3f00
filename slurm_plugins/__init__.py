"""Controller-side pieces: the job_submit.lua bridge and nuro-admin. Import as nuro.slurm_plugins."""
