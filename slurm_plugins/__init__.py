"""What runs on the controller host: the job_submit bridge (``job_submit.lua``, inside slurmctld), the controller
daemon ``nuro-controller`` (``controller/``) and ``nuro-mlflow-bridge`` (``mlflow_bridge.py``). Import as
nuro.slurm_plugins; ``nuro-admin`` lives in ``admin/``."""
