"""The ``NURO_*`` environment variables more than one part of nuro reads or writes, named once.

Why: a variable is a contract between a writer (the rendered batch script, the node's environment file, an admin's
unit file) and its readers (the SDK in every rank, root's prolog, the node agent, the CLIs); a name spelled twice
drifts apart silently, and the reader then takes its default. Every module uses these constants, never the literal.
A variable only one module knows lives beside that module (e.g. ``nuro.runs.pending.ENV_WAITS``). Standard library
only: the SDK imports it in every training rank.
"""

from __future__ import annotations

# -- the run, as the rendered batch script exports it (nuro.jobspec.record.job_env) and the SDK reads it ----------
NURO_TEAM = "NURO_TEAM"  # the team (Slurm account) whose prefixes the job's credentials reach
NURO_RUN_NAME = "NURO_RUN_NAME"  # the run: checkpoints/<team>/<run>/, runs/<team>/<run>/events/
NURO_DATASET = "NURO_DATASET"  # the pinned dataset snapshot's name
NURO_DATASET_DIGEST = "NURO_DATASET_DIGEST"  # ... and its digest
NURO_DATA_SEED = "NURO_DATA_SEED"  # the data order's seed (the SDK's SnapshotLoader default)
NURO_CKPT_INTERVAL_S = "NURO_CKPT_INTERVAL_S"  # checkpoint every this many seconds
NURO_CKPT_KEEP = "NURO_CKPT_KEEP"  # keep the newest this many checkpoints
NURO_SNAPSHOT_INTERVAL_S = "NURO_SNAPSHOT_INTERVAL_S"  # in-memory snapshots this often (0: off)
NURO_RESUME_FROM = "NURO_RESUME_FROM"  # the earlier job whose latest valid checkpoint this run starts from
NURO_MAX_REQUEUES = "NURO_MAX_REQUEUES"  # the script's requeue budget
NURO_PREEMPT_SIGNAL = "NURO_PREEMPT_SIGNAL"  # the signal that means "checkpoint and exit 75"
NURO_SPARE_NODES = "NURO_SPARE_NODES"  # hot spare nodes the launcher holds back
NURO_DEEPSPEED_CONFIG = "NURO_DEEPSPEED_CONFIG"  # the DeepSpeed config the script passes to deepspeed.initialize

# -- the launcher <-> SDK, inside the job (nuro.wrappers.launch, nuro.wrappers.sdk) ----------------------------------
NURO_JOB_DIR = "NURO_JOB_DIR"  # the job's run directory on shared storage
NURO_STAGING_DIR = "NURO_STAGING_DIR"  # this job's checkpoint staging directory on the node
NURO_LAUNCH_STOP_DIR = "NURO_LAUNCH_STOP_DIR"  # where the launcher and the ranks leave their stop markers
NURO_PG_TIMEOUT_S = "NURO_PG_TIMEOUT_S"  # torch.distributed's process-group timeout in the job
NURO_RDZV_ADDR = "NURO_RDZV_ADDR"  # the rendezvous host: the first training node's address
NURO_RDZV_PORT = "NURO_RDZV_PORT"  # the rendezvous port (contract.rdzv_port)

# -- the node (root's hooks, the node agent, the health check; the node's environment file) -------------------------
NURO_STAGING_ROOT = "NURO_STAGING_ROOT"  # checkpoint staging root on the node ({node} for emulated nodes)
NURO_ENV_FILE = "NURO_ENV_FILE"  # the node's nuro environment file (nuro.protocol.nodeenv)
NURO_AGENT_SOCKET_DIR = "NURO_AGENT_SOCKET_DIR"  # the node agent's report sockets
NURO_AGENT_STATUS_DIR = "NURO_AGENT_STATUS_DIR"  # the node agent's status files, read by the health check
NURO_DATA_CACHE_DIR = "NURO_DATA_CACHE_DIR"  # the node's dataset shard cache
NURO_DATA_CACHE_GB = "NURO_DATA_CACHE_GB"  # ... and its budget

# -- S3 (nuro.objectstore): the endpoint, bucket and credentials of the node or the job ------------------------------
NURO_S3_ENDPOINT = "NURO_S3_ENDPOINT"
NURO_S3_BUCKET = "NURO_S3_BUCKET"
NURO_S3_REGION = "NURO_S3_REGION"
NURO_S3_CREDENTIALS = "NURO_S3_CREDENTIALS"  # a directory of per-team credential files

# -- the platform's services and the admin's files ---------------------------------------------------------------------
NURO_EVENT_LOG = "NURO_EVENT_LOG"  # the controller's platform event log (JSONL)
NURO_POLICY = "NURO_POLICY"  # teams.yaml, for the CLIs' previews
