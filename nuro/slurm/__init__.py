"""nuro's Slurm adapter: read cluster snapshots and apply actions through Slurm's own clients.

Layers (each its own module):

* ``models``, ``states``: frozen value types and the one job-state table;
* ``hostlist``, ``parse``: pure parsing of everything Slurm prints;
* ``actions``: frozen actions and their rendering to an exact argv (render is separate from execute);
* ``errors``: exceptions classified from Slurm's own stderr;
* ``cli_runner`` (running a command), ``cli_reads`` and ``cli_writes``: the CLI backend's three rooms;
* ``backend`` (``Backend``, and ``CliBackend``, the default, made of those rooms) and ``pyslurm_backend``
  (optional, version-guarded) with ``make_backend``.

Example::

    from nuro.slurm import make_backend
    backend = make_backend(env={"SLURM_CONF": "/path/slurm.conf"})
    snap = backend.read_snapshot()
    job_id = backend.submit("#!/bin/bash\\nsrun hostname\\n", "-N2", "--gres=gpu:8")
"""

from nuro.slurm.actions import (
    Action,
    ActionResult,
    Cancel,
    DownNode,
    DrainNode,
    Hold,
    Release,
    Requeue,
    ResumeNode,
    Signal,
    Submit,
    SubmitCommand,
    UpdateAdminComment,
    UpdateComment,
    UpdateJobs,
    UpdateNodeWeight,
    UpdateQos,
    UpdateQosMinGpus,
    UpdateSiteFactor,
    UpdateStartTime,
    render_argv,
    render_stdin,
)
from nuro.slurm.backend import Backend, CliBackend
from nuro.slurm.cli_reads import CliReads
from nuro.slurm.cli_runner import CliRunner
from nuro.slurm.cli_writes import CliWrites
from nuro.slurm.errors import (
    InvalidJobId,
    InvalidNodeName,
    InvalidState,
    JobWaitTimeout,
    PermissionDenied,
    SlurmCommandNotFound,
    SlurmConfigMissing,
    SlurmError,
    SlurmParseError,
    SlurmTimeout,
    SlurmUnavailable,
    SubmissionRejected,
    classify_error,
)
from nuro.slurm.hostlist import HostlistError
from nuro.slurm.hostlist import compress as compress_hostlist
from nuro.slurm.hostlist import expand as expand_hostlist
from nuro.slurm.models import ClusterSnapshot, JobInfo, NodeInfo, PartitionInfo, SlurmVersion
from nuro.slurm.parse import (
    attach_switches,
    merge_resized,
    newest_data_parser,
    parse_node_addr,
    parse_sacct_exitcodes,
    parse_sacct_json,
    parse_sacctmgr_parsable,
    parse_sbatch_parsable,
    parse_scontrol_partitions,
    parse_scontrol_show_oneliner,
    parse_scontrol_show_topology,
    parse_sinfo_json,
    parse_squeue_format,
    parse_squeue_json,
    parse_version,
    topology_kind,
)
from nuro.slurm.pyslurm_backend import BackendPreference, PyslurmBackend, make_backend
from nuro.slurm.states import SLURM_STATES, JobPhase, to_phase

__all__ = [
    "Action",
    "ActionResult",
    "Backend",
    "BackendPreference",
    "Cancel",
    "CliBackend",
    "CliReads",
    "CliRunner",
    "CliWrites",
    "ClusterSnapshot",
    "DownNode",
    "DrainNode",
    "Hold",
    "HostlistError",
    "InvalidJobId",
    "InvalidNodeName",
    "InvalidState",
    "JobInfo",
    "JobPhase",
    "NodeInfo",
    "PartitionInfo",
    "PermissionDenied",
    "PyslurmBackend",
    "Release",
    "Requeue",
    "ResumeNode",
    "SLURM_STATES",
    "Signal",
    "SlurmCommandNotFound",
    "SlurmConfigMissing",
    "SlurmError",
    "SlurmParseError",
    "SlurmTimeout",
    "JobWaitTimeout",
    "SlurmUnavailable",
    "SlurmVersion",
    "SubmissionRejected",
    "Submit",
    "SubmitCommand",
    "UpdateQos",
    "UpdateAdminComment",
    "UpdateComment",
    "UpdateJobs",
    "UpdateNodeWeight",
    "UpdateQosMinGpus",
    "UpdateSiteFactor",
    "UpdateStartTime",
    "attach_switches",
    "classify_error",
    "compress_hostlist",
    "expand_hostlist",
    "make_backend",
    "parse_sacct_exitcodes",
    "merge_resized",
    "parse_sacct_json",
    "parse_node_addr",
    "parse_sacctmgr_parsable",
    "parse_sbatch_parsable",
    "parse_scontrol_partitions",
    "parse_scontrol_show_oneliner",
    "newest_data_parser",
    "parse_scontrol_show_topology",
    "topology_kind",
    "parse_sinfo_json",
    "parse_squeue_format",
    "parse_squeue_json",
    "parse_version",
    "render_argv",
    "render_stdin",
    "to_phase",
]
