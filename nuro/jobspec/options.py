"""The job spec's one declaration table: every option once, with its kind, default, unit and help.

``SPEC_OPTIONS`` generates the YAML schema (nested groups ``code``, ``entrypoint``, ``checkpoint``), the validation
(``nuro.jobspec.spec.build_spec``), the ``nuro-train submit`` click options (``click_options``), the platform flags of
``nuro-sbatch`` (the options marked ``sbatch=True``) and the options table in docs/submit.md (``options_markdown``;
a unit test checks the page carries exactly that table). Adding an option here adds it everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nuro.jobspec.fields import (
    TEAM_PATTERN,
    AbsPath,
    ArgList,
    Choice,
    Commit,
    DatasetRef,
    EnvMap,
    FieldError,
    Flag,
    Int,
    Kind,
    RelPath,
    Text,
    TimeLimit,
)
from nuro.protocol.contract import DEFAULT_CKPT_KEEP, MAX_SPARE_NODES


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class PythonCommand(Kind):
    """The interpreter that runs ``-m torch.distributed.run``: a bare command name looked up on the nodes' PATH,
    or an absolute path (a venv on shared storage)."""

    metavar: str = "PYTHON"

    def parse(self, raw: Any) -> str:
        if isinstance(raw, str) and raw.startswith("/"):
            return AbsPath().parse(raw)
        return Text(
            pattern=r"^[A-Za-z][A-Za-z0-9._+-]{0,63}$", max_len=64, chars=r"[A-Za-z0-9._+-]",
            doc="a command name (letters, digits and . _ + -) or an absolute path",
        ).parse(raw)  # fmt: skip


@dataclass(frozen=True)
class Opt:
    """One job spec option.

    Attributes:
        name: the YAML key; a dot nests it under a group (``code.repo`` is ``code: {repo: ...}``).
        kind: checks and converts the raw value (``nuro.jobspec.fields``).
        default: the value when not given (already in parsed form), or ``REQUIRED``.
        unit: the unit of a number, shown in help and docs ("" when none).
        help: one line for --help and the docs table.
        flag: the command-line flag (``nuro-train submit`` and, when ``sbatch``, ``nuro-sbatch``).
        attr: the ``JobSpec`` attribute.
        sbatch: also a platform flag of nuro-sbatch (the rest comes from plain sbatch options there).
        multiple: the flag may repeat (lists, KEY=VALUE maps).
        default_doc: how the docs show the default when it is not a literal (e.g. "the team's g-<team> QOS").
    """

    name: str
    kind: Kind
    default: Any
    unit: str
    help: str
    flag: str
    attr: str
    sbatch: bool = False
    multiple: bool = False
    default_doc: str | None = None
    metavar: str | None = None

    @property
    def metavar_text(self) -> str:
        return self.metavar if self.metavar is not None else self.kind.metavar

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def parse(self, raw: Any) -> Any:
        """The checked value; ``FieldError`` messages are prefixed with the option name by the caller."""
        return self.kind.parse(raw)


_NAME = Text(
    pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$", max_len=63, chars=r"[A-Za-z0-9._-]",
    doc="letters, digits and . _ - (at most 63), starting with a letter or digit",
)  # fmt: skip
_TEAM = Text(
    pattern=TEAM_PATTERN, max_len=31, chars=r"[a-z0-9_]",
    doc="a team/QOS name: lower-case letters, digits and _ (at most 31), starting with a letter",
)  # fmt: skip
_JOB_ID = Text(
    pattern=r"^[1-9][0-9]{0,9}$", max_len=10, chars=r"[0-9]",
    doc="the Slurm job id of an earlier run (digits only)",
)  # fmt: skip

SPEC_OPTIONS: tuple[Opt, ...] = (
    Opt("name", _NAME, REQUIRED, "", "Run name: the Slurm job name and the run directory under run_root.",
        "--name", "name", metavar="NAME"),
    Opt("team", _TEAM, REQUIRED, "", "Team = Slurm account; its quota and borrowing apply.", "--team", "team",
        sbatch=True, metavar="TEAM"),
    Opt("tier", _TEAM, None, "", "Priority tier QOS from teams.yaml (e.g. urgent); default: the team's guaranteed "
        "QOS g-<team>.", "--tier", "tier", sbatch=True, default_doc="g-<team>", metavar="TIER"),
    Opt("nodes", Int(minimum=1, maximum=1024), 1, "nodes", "Nodes, all allocated at once (gang).", "--nodes",
        "nodes"),
    Opt("spare_nodes", Int(minimum=0, maximum=MAX_SPARE_NODES), 0, "nodes", "Hot spare nodes allocated with the "
        "job (sbatch --no-kill): when a training node dies, nuro-launch goes on with a spare from the newest "
        "checkpoint, without a requeue; spares count in the quota like any allocated node.",
        "--spare-nodes", "spare_nodes", sbatch=True),
    Opt("gpus_per_node", Int(minimum=0, maximum=16), 8, "GPUs", "GPUs per node; 0 runs one CPU process per node.",
        "--gpus-per-node", "gpus_per_node"),
    Opt("time_limit", TimeLimit(), 3600, "", "Wall-clock limit per attempt, in sbatch's forms (90, 4:00:00, "
        "2-12:00:00).", "--time", "time_limit_s", default_doc="1:00:00"),
    Opt("dataset", DatasetRef(), REQUIRED, "", "Dataset snapshot NAME@TAG or NAME@sha256:<hex>; a tag is resolved "
        "to its digest at submit and only the digest is recorded.", "--dataset", "dataset", sbatch=True),
    Opt("data_seed", Int(minimum=0, maximum=2**31 - 1), 0, "", "Seed of the data order (NURO_DATA_SEED, the "
        "default of the SDK's SnapshotLoader), recorded with the run; the prolog prefetches the shards that order "
        "reads first.", "--data-seed", "data_seed", sbatch=True),
    Opt("code.repo", AbsPath(), REQUIRED, "", "Git repository (its top level, on storage the nodes see). On the "
        "command line REPO[@COMMIT], relative to the current directory.", "--code", "code_repo", sbatch=True,
        metavar="REPO[@COMMIT]"),
    Opt("code.commit", Commit(), None, "", "Commit to run; default: the repository's HEAD, which must then be "
        "clean.", "--commit", "code_commit", sbatch=True, default_doc="HEAD"),
    Opt("code.allow_dirty", Flag(), False, "", "Run HEAD plus the uncommitted changes: the diff is recorded and "
        "shipped with the job.", "--allow-dirty", "allow_dirty", sbatch=True),
    Opt("entrypoint.script", RelPath(), REQUIRED, "", "Training script, relative to the repository, started on "
        "every node by nuro-launch with torchrun's variables (`--launcher=direct`).", "--script", "script"),
    Opt("entrypoint.args", ArgList(), (), "", "Arguments for the script (repeat the flag once per argument).",
        "--arg", "args", multiple=True),
    Opt("entrypoint.launcher", Choice(metavar="torchrun|deepspeed", choices=("torchrun", "deepspeed")), None, "",
        "How the script trains: torchrun (DDP and the like) or deepspeed (a DeepSpeed engine; needs "
        "entrypoint.deepspeed_config). Both start under nuro-launch with torchrun's variables.", "--launcher",
        "launcher", sbatch=True, default_doc="deepspeed with a DeepSpeed config, else torchrun"),
    Opt("entrypoint.deepspeed_config", RelPath(), None, "", "DeepSpeed config (relative to the repository), checked "
        "at submit against the installed DeepSpeed and the job's world size; adds --deepspeed --deepspeed_config "
        "<path> to the script's arguments and exports NURO_DEEPSPEED_CONFIG.", "--deepspeed-config",
        "deepspeed_config", sbatch=True),
    Opt("entrypoint.python", PythonCommand(), "python3", "", "Interpreter on the nodes that runs "
        "torch.distributed.run.", "--python", "python"),
    Opt("env", EnvMap(), (), "", "Environment for the training processes (KEY=VALUE; repeat the flag).", "--env",
        "env", multiple=True),
    Opt("checkpoint.interval_s", Int(minimum=1, maximum=7 * 86400), 1800, "s", "Checkpoint every this many "
        "seconds (NURO_CKPT_INTERVAL_S for the SDK).", "--ckpt-interval", "ckpt_interval_s", sbatch=True),
    Opt("checkpoint.keep", Int(minimum=1, maximum=1000), DEFAULT_CKPT_KEEP, "checkpoints", "Keep the newest this "
        "many checkpoints (plus tagged ones).", "--ckpt-keep", "ckpt_keep", sbatch=True),
    Opt("checkpoint.snapshot_interval_s", Int(minimum=0, maximum=3600), 0, "s", "Also take an in-memory snapshot "
        "this often, each node's share sent to the next node (0 = off; NURO_SNAPSHOT_INTERVAL_S for the SDK): a node "
        "loss then costs seconds of training, not half a checkpoint interval.", "--snapshot-interval",
        "snapshot_interval_s", sbatch=True),
    Opt("resume_from", _JOB_ID, None, "", "Start from the latest valid checkpoint of this earlier run (job id).",
        "--resume-from", "resume_from", sbatch=True, metavar="JOB_ID"),
    Opt("max_requeues", Int(minimum=0, maximum=100), 3, "requeues", "Requeue budget: how many times the job "
        "requeues itself (preemption, time limit, EXIT_REQUEUE) before it fails.", "--max-requeues",
        "max_requeues", sbatch=True),
    Opt("stop_warning_s", Int(minimum=30, maximum=3600), 120, "s", "Slurm sends USR2 this long before the time "
        "limit, so the job can checkpoint.", "--stop-warning", "stop_warning_s"),
    Opt("run_root", AbsPath(), None, "", "Directory for run output and checkouts (<run_root>/<name>/<job id>); on "
        "storage every node sees.", "--run-root", "run_root", sbatch=True, default_doc="~/nuro-runs"),
)  # fmt: skip

OPTIONS_BY_NAME: dict[str, Opt] = {o.name: o for o in SPEC_OPTIONS}
OPTIONS_BY_FLAG: dict[str, Opt] = {o.flag: o for o in SPEC_OPTIONS}
#: YAML groups: a top-level key whose value is a mapping of the options under it.
GROUPS: frozenset[str] = frozenset(o.name.split(".")[0] for o in SPEC_OPTIONS if "." in o.name)


def default_text(opt: Opt) -> str:
    """The default as help and docs show it."""
    if opt.required:
        return "required"
    if opt.default_doc is not None:
        return opt.default_doc
    if opt.default is None or opt.default == ():
        return "none"
    if isinstance(opt.default, bool):
        return "true" if opt.default else "false"
    return str(opt.default)


def valid_keys_text() -> str:
    """Every valid key with its default: what an unknown-key error lists."""
    return ", ".join(f"{o.name} (default: {default_text(o)})" for o in SPEC_OPTIONS)


def options_markdown() -> str:
    """The options table of docs/submit.md, generated from ``SPEC_OPTIONS``."""
    rows = ["| YAML key | flag | default | unit | nuro-sbatch | meaning |", "|---|---|---|---|---|---|"]
    for o in SPEC_OPTIONS:
        flag = f"`{o.flag} {o.metavar_text}`" if o.metavar_text else f"`{o.flag}`"
        rows.append(
            f"| `{o.name}` | {flag}{' (repeat)' if o.multiple else ''} | {default_text(o)} | {o.unit} | "
            f"{'yes' if o.sbatch else ''} | {o.help} |"
        )
    return "\n".join(rows) + "\n"


def click_options(opts: Sequence[Opt] = SPEC_OPTIONS) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator adding one click option per ``Opt``. Every default is None (or empty) so the command can tell
    "not given" from "given": flags override the spec file only when given. Values are checked by ``build_spec``,
    not by click, so the spec file and the flags get the same messages."""
    import click  # lazy: only the CLIs build click options; training ranks read this table without click

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        for o in reversed(opts):
            help_text = f"{o.help} [default: {default_text(o)}{' ' + o.unit if o.unit and not o.required else ''}]"
            dest = "opt_" + o.attr
            if isinstance(o.kind, Flag):
                fn = click.option(o.flag, dest, is_flag=True, default=None, help=help_text)(fn)
            else:
                fn = click.option(
                    o.flag, dest, metavar=o.metavar_text, multiple=o.multiple, default=None, help=help_text
                )(fn)
        return fn

    return decorate


def flag_values(kwargs: dict[str, Any], opts: Sequence[Opt] = SPEC_OPTIONS) -> dict[str, Any]:
    """The options given on the command line (from ``click_options``' parameters), keyed by option name."""
    out: dict[str, Any] = {}
    for o in opts:
        value = kwargs.get("opt_" + o.attr)
        if value is None or (o.multiple and len(value) == 0) or (isinstance(o.kind, Flag) and value is False):
            continue
        out[o.name] = list(value) if o.multiple else value
    return out


__all__ = [
    "GROUPS",
    "OPTIONS_BY_FLAG",
    "OPTIONS_BY_NAME",
    "REQUIRED",
    "SPEC_OPTIONS",
    "FieldError",
    "Opt",
    "PythonCommand",
    "click_options",
    "default_text",
    "flag_values",
    "options_markdown",
    "valid_keys_text",
]
