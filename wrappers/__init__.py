"""What runs inside a job: ``nuro-launch`` (the launcher, ``launch.py``, its outcome rules ``launch_outcome.py``, hot
spares ``spares.py``), ``nuro-job`` (the job's channel to its node agent, ``jobchannel.py``) and the training SDK
(``sdk/``). Import as nuro.wrappers; the users' CLIs (nuro-train, nuro-sbatch) live in ``login/``."""
