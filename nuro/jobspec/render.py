"""Render a checked job spec into the exact sbatch submission: a pure function, golden-tested.

``render_submission(spec, pins, facts) -> SbatchRequest`` reads nothing from the cluster or the disk: the dataset
digest and the code commit come in as ``Pins`` (resolved and pinned by the caller), the topology hint's leaf size and
wait come in as ``ClusterFacts`` (from the policy table). ``nuro-train submit --dry-run`` prints the result; submit
hands ``script`` and ``args`` to the Slurm adapter unchanged.

Choices, and why:

* run record: ``--comment=<compact JSON>`` on sbatch's command line, not an ``#SBATCH`` line: sbatch's directive
  parser strips the double quotes JSON needs, while argv reaches Slurm verbatim.
* time-limit warning: ``--signal=B:USR2@<stop_warning_s>``. USR1 is the controller's preemption signal
  (``nuro.protocol.contract.PREEMPT_SIGNAL``); a second signal tells the job *why* it stops. ``B:`` sends it to the
  batch shell only, which records the reason and forwards it to the step once (no double delivery).
* requeue: ``--requeue`` plus the budget inside the job (T6): the script requeues itself on ``EXIT_REQUEUE`` or a
  stop signal while ``SLURM_RESTART_COUNT`` < budget, so restarts work with the controller down.
* output: ``--open-mode=append``: a requeued job keeps its job id and must not truncate earlier attempts' log.
* topology: ``--switches=1@<wait>`` (tree) or ``--segment=<nodes>`` (block) for 2..leaf nodes, as the bridge's
  table says: the bridge adds the same hint; rendering it makes the script self-describing.
* code: ``git archive <commit>`` into the job dir, not ``git worktree add``: read-only on the user's repository (no
  worktree records, locks or clean-up after killed jobs, works on read-only mounts), the archive carries its commit
  id, which the job verifies (``git get-tar-commit-id``), and nothing uncommitted can leak in. The cost: the
  checkout has no ``.git``, so code that asks git for its version should read ``NURO_CODE_COMMIT`` instead.

Every value was checked against an allow-list (``nuro.jobspec``) before it gets here; it is still ``shlex.quote``d,
and values on ``#SBATCH`` lines must need no quoting at all (``RenderError`` otherwise).
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nuro.jobspec import JobSpec
from nuro.jobspec.codepin import CodePin
from nuro.jobspec.pins import DatasetPin
from nuro.jobspec.record import comment_json, export_lines, job_env, run_record
from nuro.protocol.contract import (
    ENV_RDZV_PORT_BASE,
    ENV_RDZV_PORT_SPAN,
    EXIT_REQUEUE,
    PREEMPT_SIGNAL,
    RDZV_PORT_BASE,
    RDZV_PORT_SPAN,
    TIME_LIMIT_SIGNAL,
)
from nuro.protocol.envnames import (
    NURO_CKPT_INTERVAL_S,
    NURO_CKPT_KEEP,
    NURO_DATA_SEED,
    NURO_DATASET,
    NURO_DATASET_DIGEST,
    NURO_DEEPSPEED_CONFIG,
    NURO_MAX_REQUEUES,
    NURO_PREEMPT_SIGNAL,
    NURO_RESUME_FROM,
    NURO_RUN_NAME,
    NURO_SNAPSHOT_INTERVAL_S,
    NURO_SPARE_NODES,
    NURO_TEAM,
)

#: Seconds a stuck ``scontrol requeue`` may take inside the job before the job gives up.
REQUEUE_TIMEOUT_S = 60


class RenderError(ValueError):
    """A value cannot be rendered safely (a bug upstream: the spec checks should have refused it)."""


@dataclass(frozen=True)
class Pins:
    """What submit resolved before rendering: the exact code and data of the run."""

    code: CodePin
    dataset: DatasetPin


@dataclass(frozen=True)
class ClusterFacts:
    """Cluster facts the renderer needs, passed in (a dry run never asks the cluster).

    Attributes:
        leaf_nodes: nodes under one leaf switch; jobs of 2..leaf_nodes get ``--switches=1@<switch_wait_s>``.
        switch_wait_s: how long such a job waits for one leaf before Slurm places it across leaves.
        topology_hint: ``switches`` (topology/tree), ``segment`` (topology/block: ``--segment=<nodes>``, the whole
            job one segment, so one block) or ``none``; as the bridge's table says (``policy apply`` reads it from
            the cluster).
        rdzv_port_base, rdzv_port_span: the torchrun rendezvous port is base + job id mod span (two jobs sharing
            a first node must not collide; below the ephemeral range).
    """

    leaf_nodes: int = 4
    switch_wait_s: int = 60
    topology_hint: str = "switches"
    rdzv_port_base: int = RDZV_PORT_BASE
    rdzv_port_span: int = RDZV_PORT_SPAN

    @classmethod
    def from_policy_table(cls, table: Mapping[str, Any]) -> ClusterFacts:
        """The facts the job_submit bridge uses (``nuro.policy.luatable.policy_table``)."""
        return cls(
            leaf_nodes=int(table["leaf_nodes"]),
            switch_wait_s=int(table["switch_wait_s"]),
            topology_hint=str(table.get("topology_hint", "switches")),
        )


@dataclass(frozen=True)
class SbatchRequest:
    """The submission as a value: print it, diff it, test it, then submit it unchanged (T1).

    Attributes:
        script: the whole batch script (sent on sbatch's stdin).
        args: sbatch options given on the command line (the comment).
        comment: the job comment, compact JSON (``{"nuro": {...}}``).
        output_dir: must exist before sbatch runs (Slurm opens the output file there when the job starts).
        meta: the ``nuro`` record inside the comment, as data.
    """

    script: str
    args: tuple[str, ...]
    comment: str
    output_dir: str
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def argv(self) -> tuple[str, ...]:
        """The command the Slurm adapter runs (script on stdin)."""
        return ("sbatch", "--parsable", *self.args)


def _q(value: object) -> str:
    return shlex.quote(str(value))


def _directive(option: str, value: object | None = None) -> str:
    if value is None:
        return f"#SBATCH {option}"
    text = str(value)
    if shlex.quote(text) != text:
        raise RenderError(f"{option} value {text!r} would need quoting on an #SBATCH line; refusing to render it")
    return f"#SBATCH {option}={text}"


def slurm_time(seconds: int) -> str:
    """Seconds as sbatch's ``D-HH:MM:SS``."""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"


def _wait_time(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def code_pin_text(code: CodePin) -> str:
    """``<commit>`` or ``<commit>+sha256:<patch digest>``: what the job dir's ``code.pin`` marker records."""
    return code.commit + (f"+{code.diff_sha256}" if code.diff_sha256 else "")


def run_metadata(spec: JobSpec, pins: Pins) -> dict[str, Any]:
    """The ``nuro`` record of the job comment (``nuro.jobspec.record.run_record``), with the entry point."""
    entry: dict[str, Any] = {"launcher": spec.launcher, "script": spec.script, "args": list(spec.args)}
    if spec.deepspeed_config:
        entry["deepspeed_config"] = spec.deepspeed_config
    return run_record(
        name=spec.name,
        team=spec.team,
        tier=spec.tier,
        dataset=pins.dataset,
        code=pins.code,
        entry=entry,
        ckpt_interval_s=spec.ckpt_interval_s,
        snapshot_interval_s=spec.snapshot_interval_s,
        ckpt_keep=spec.ckpt_keep,
        resume_from=spec.resume_from,
        max_requeues=spec.max_requeues,
        data_seed=spec.data_seed,
        spare_nodes=spec.spare_nodes,
    )


def checkout_lines(code: CodePin) -> list[str]:
    """POSIX sh that puts exactly ``code`` into ``$NURO_CODE_DIR`` once per job (a requeue reuses it).

    Expects ``NURO_JOB_DIR``, ``NURO_CODE_DIR``, ``NURO_CODE_REPO``, ``NURO_CODE_COMMIT``, ``NURO_CODE_PIN`` and
    the ``nuro_fail``/``nuro_git`` functions. Shared by the rendered script and nuro-sbatch's preamble.
    """
    lines = [
        'mkdir -p "$NURO_JOB_DIR" || nuro_fail "cannot create the job directory $NURO_JOB_DIR"',
        'if [ "$(cat "$NURO_JOB_DIR/code.pin" 2>/dev/null)" != "$NURO_CODE_PIN" ]; then',
        '  nuro_tmp="$NURO_JOB_DIR/.code.tmp"',
        '  rm -rf "$nuro_tmp" "$nuro_tmp.tar" "$nuro_tmp.patch" && mkdir -p "$nuro_tmp" || nuro_fail "cannot prepare $nuro_tmp"',  # noqa: E501
        '  nuro_git -C "$NURO_CODE_REPO" archive --format=tar -o "$nuro_tmp.tar" "$NURO_CODE_COMMIT" \\',
        '    || nuro_fail "git archive of commit $NURO_CODE_COMMIT from $NURO_CODE_REPO failed (was it garbage-collected?)"',  # noqa: E501
        # from / : git 2.39's get-tar-commit-id exits 1 with nothing printed when the cwd is ~130+ characters deep
        '  nuro_got=$(cd / && nuro_git get-tar-commit-id < "$nuro_tmp.tar")',
        '  [ "$nuro_got" = "$NURO_CODE_COMMIT" ] || nuro_fail "the archive holds commit \'$nuro_got\', not $NURO_CODE_COMMIT"',  # noqa: E501
        '  tar -x -f "$nuro_tmp.tar" -C "$nuro_tmp" || nuro_fail "unpacking commit $NURO_CODE_COMMIT failed"',
        '  rm -f "$nuro_tmp.tar"',
    ]
    if code.diff is not None and code.diff_sha256:
        delimiter = "NURO_PATCH_" + code.diff_sha256.split(":", 1)[1][:16]  # '_' never occurs in base64
        encoded = base64.encodebytes(code.diff).decode("ascii").splitlines()
        lines += [
            f"  # uncommitted changes shipped with the job (--allow-dirty): {len(code.diff)} bytes, {code.diff_sha256}",
            f"  base64 -d > \"$nuro_tmp.patch\" <<'{delimiter}'",
            *encoded,
            delimiter,
            f'  [ "sha256:$(sha256sum < "$nuro_tmp.patch" | cut -d " " -f 1)" = {_q(code.diff_sha256)} ] \\',
            '    || nuro_fail "the shipped patch does not match its recorded digest"',
            '  (cd "$nuro_tmp" && GIT_CEILING_DIRECTORIES="$NURO_JOB_DIR" && export GIT_CEILING_DIRECTORIES \\',
            '    && nuro_git apply --whitespace=nowarn "$nuro_tmp.patch") || nuro_fail "applying the shipped patch failed"',  # noqa: E501
            '  rm -f "$nuro_tmp.patch"',
        ]
    lines += [
        '  rm -rf "$NURO_CODE_DIR" && mv "$nuro_tmp" "$NURO_CODE_DIR" || nuro_fail "cannot move the checkout into place"',  # noqa: E501
        '  printf \'%s\\n\' "$NURO_CODE_PIN" > "$NURO_JOB_DIR/code.pin"',
        '  echo "nuro: checked out commit $nuro_got (id verified from the archive) into $NURO_CODE_DIR"',
        "else",
        '  echo "nuro: reusing the checkout of $NURO_CODE_PIN in $NURO_CODE_DIR (requeued job)"',
        "fi",
    ]
    return lines


#: Shell helpers both scripts define. nuro_git drops git variables a submitting shell may have exported.
HELPER_LINES = [
    'nuro_fail() { echo "nuro: $*" >&2; exit 1; }',
    "nuro_git() { env -u GIT_DIR -u GIT_WORK_TREE -u GIT_INDEX_FILE -u GIT_OBJECT_DIRECTORY \\",
    '  -u GIT_ALTERNATE_OBJECT_DIRECTORIES -u GIT_NAMESPACE -u GIT_CONFIG_PARAMETERS -u GIT_CONFIG_COUNT git "$@"; }',
]


def code_exports(code: CodePin, job_dir: str) -> list[str]:
    """Exports describing the pinned code and where it goes; ``job_dir`` is a path ending in ``/$SLURM_JOB_ID``."""
    return [
        f"export NURO_CODE_REPO={_q(code.repo)}",
        f"export NURO_CODE_COMMIT={_q(code.commit)}",
        f"export NURO_CODE_PIN={_q(code_pin_text(code))}",
        f'export NURO_JOB_DIR={job_dir}/"$SLURM_JOB_ID"',
        'export NURO_CODE_DIR="$NURO_JOB_DIR/code"',
    ]


def _launch_lines(spec: JobSpec, facts: ClusterFacts) -> list[str]:
    """Section 4: ``nuro-launch`` on every node (one srun task each) starts the workers with torchrun's variables
    (``--launcher=direct``: no torchrun agent, see ``wrappers.direct``); ``nuro-launch --step`` around
    the srun relays the batch shell's signals and folds the nodes' verdicts into the exit ``nuro_finish`` acts on
    (srun's own status is the maximum over tasks, so a node killed by --kill-on-bad-exit would hide a 75)."""
    nproc = spec.gpus_per_node if spec.gpus_per_node > 0 else 1
    args = list(spec.args)
    if spec.deepspeed_config:
        args += ["--deepspeed", "--deepspeed_config", spec.deepspeed_config]
    script_args = "".join(f" {_q(a)}" for a in args)
    python = _q(spec.python)
    # with spares: the training nodes only, and as many tasks (the job's SLURM_NTASKS counts the spares too)
    step_nodes = f"{spec.nodes} --ntasks={spec.nodes}" if spec.spare_nodes else '"$SLURM_JOB_NUM_NODES"'
    return [
        "# 4. launch: nuro-launch per node (srun) starts the workers, rendezvous on the first node of the allocation;",
        "#    nuro-launch --step folds the nodes' verdicts: 0 done, 75 restart me, else the training's failure",
        'NURO_RDZV_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "NURO_RDZV_ADDR=$(scontrol show node -o \"$NURO_RDZV_HOST\" | sed -n 's/.* NodeAddr=\\([^ ]*\\).*/\\1/p')",
        ': "${NURO_RDZV_ADDR:=$NURO_RDZV_HOST}"',
        f"NURO_RDZV_PORT=$((${{{ENV_RDZV_PORT_BASE}:-{facts.rdzv_port_base}}} + SLURM_JOB_ID % "
        f"${{{ENV_RDZV_PORT_SPAN}:-{facts.rdzv_port_span}}}))",
        'export NURO_RDZV_ADDR NURO_RDZV_PORT NURO_LAUNCH_DIR="$NURO_JOB_DIR/launch"',
        'cd "$NURO_CODE_DIR" || nuro_fail "cannot enter $NURO_CODE_DIR"',
        *[f"export {key}={_q(value)}" for key, value in spec.env],
        f"{python} -m nuro.wrappers.launch --step -- \\",
        # with spares the step runs on the training nodes only; nuro-launch --step names them (--nodelist)
        f"  srun --nodes={step_nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 \\",
        f"  {python} -m nuro.wrappers.launch --launcher=direct --nproc-per-node={nproc} -- \\",
        f"    {_q(spec.script)}{script_args} &",
        "NURO_STEP_PID=$!",
    ]


_FINISH_LINES = [
    "# done, requeue within the budget (T6: decided here, so it works with the controller down), or fail",
    "nuro_finish() {",
    '  if [ "$1" -eq 0 ]; then echo "nuro: run finished"; exit 0; fi',
    '  if [ "$1" -ne "$NURO_EXIT_REQUEUE" ] && [ -z "$NURO_STOP_REASON" ]; then',
    '    echo "nuro: training exited with status $1: a failure, not a stop; not requeued" >&2',
    '    exit "$1"',
    "  fi",
    "  nuro_restarts=${SLURM_RESTART_COUNT:-0}",
    "  nuro_reason=${NURO_STOP_REASON:-exit $1}",
    '  if [ "$nuro_restarts" -ge "$NURO_MAX_REQUEUES" ]; then',
    '    echo "nuro: requeue budget spent ($nuro_restarts of $NURO_MAX_REQUEUES); stopping ($nuro_reason)" >&2',
    '    exit "$NURO_EXIT_REQUEUE"',
    "  fi",
    '  echo "nuro: requeue $((nuro_restarts + 1)) of $NURO_MAX_REQUEUES ($nuro_reason)"',
    f'  timeout {REQUEUE_TIMEOUT_S} scontrol requeue "$SLURM_JOB_ID" || nuro_fail "scontrol requeue failed"',
    '  exit "$NURO_EXIT_REQUEUE"',
    "}",
]

_WAIT_LINES = [
    "# 5. wait (a trapped signal interrupts wait: keep waiting while the step runs), then finish",
    "while :; do",
    '  nuro_rc=0; wait "$NURO_STEP_PID" || nuro_rc=$?',
    '  if [ "$nuro_rc" -gt 128 ] && kill -0 "$NURO_STEP_PID" 2>/dev/null; then continue; fi',
    "  break",
    "done",
    'nuro_finish "$nuro_rc"',
]


def render_submission(spec: JobSpec, pins: Pins, facts: ClusterFacts | None = None) -> SbatchRequest:
    """The complete sbatch submission for ``spec`` with ``pins``; pure (same inputs, same bytes).

    Raises:
        RenderError: ``spec.run_root`` is unset (the CLI fills it) or a value would need quoting on an #SBATCH line.
    """
    facts = facts or ClusterFacts()
    if spec.run_root is None:
        raise RenderError("spec.run_root is not set; the submit command fills it (default ~/nuro-runs)")
    from nuro.policy.model import guaranteed_qos  # lazy: keeps pydantic off nuro-sbatch's start-up (it imports render)

    run_dir = f"{spec.run_root}/{spec.name}"
    meta = run_metadata(spec, pins)
    env = job_env(meta)
    try:
        comment = comment_json(meta)
    except ValueError as exc:  # over Slurm's 1,024 bytes: the submission is refused here, with what to shorten
        raise RenderError(f"the run record does not fit the job comment: {exc}") from None
    head = [
        "#!/bin/bash",
        # the header names the renderer as it was first released (nuro.render): scripts diff equal across the move
        f"# nuro run {spec.name}: rendered by nuro.render from a checked job spec; do not edit, re-render instead.",
        _directive("--job-name", spec.name),
        _directive("--account", spec.team),
        _directive("--qos", spec.tier or guaranteed_qos(spec.team)),
        _directive("--nodes", spec.alloc_nodes),
        *([_directive("--no-kill")] if spec.spare_nodes else []),  # a lost node leaves the job, which keeps running
        _directive("--ntasks-per-node", 1),
        *([_directive("--gpus-per-node", spec.gpus_per_node)] if spec.gpus_per_node > 0 else []),
        _directive("--time", slurm_time(spec.time_limit_s)),
        _directive("--requeue"),
        _directive("--signal", f"B:{TIME_LIMIT_SIGNAL}@{spec.stop_warning_s}"),
        _directive("--open-mode", "append"),
        _directive("--output", f"{run_dir}/slurm-%j.out"),
    ]
    if 2 <= spec.alloc_nodes <= facts.leaf_nodes:
        if facts.topology_hint == "switches":
            head.append(_directive("--switches", f"1@{_wait_time(facts.switch_wait_s)}"))
        elif facts.topology_hint == "segment":
            head.append(_directive("--segment", spec.alloc_nodes))
    body = [
        "# The run record (team, dataset digest, commit, ...) is the job comment, given on sbatch's command line.",
        "set -uo pipefail",
        "",
        "# 1. run metadata for the training processes and the SDK",
        *export_lines(env, (NURO_RUN_NAME, NURO_TEAM, NURO_DATASET, NURO_DATASET_DIGEST, NURO_DATA_SEED)),
        *code_exports(pins.code, _q(run_dir)),
        *export_lines(env, (NURO_CKPT_INTERVAL_S, NURO_CKPT_KEEP, NURO_SNAPSHOT_INTERVAL_S)),
        "# the node agent uploads the checkpoints (this job's record names its team and run): the job ends once its",
        "# last save is on local disk and its epilog hands the upload over (NURO_UPLOAD=inline at submit: job uploads)",
        'export NURO_UPLOAD="${NURO_UPLOAD:-agent}"',
        "# the node-local staging dir the prolog created for this job (checkpoints are written here, then uploaded)",
        # the same root on every node; a root naming {node} (one per node on one shared disk: the dev cluster) is
        # resolved on each node by nuro-launch and the SDK, never here on the batch host
        'case "${NURO_STAGING_ROOT:-}" in *"{node}"*) ;; *)',
        '  export NURO_STAGING_DIR="${NURO_STAGING_DIR:-${NURO_STAGING_ROOT:-/var/tmp/nuro-staging}/$SLURM_JOB_ID}" ;;',
        "esac",
        *export_lines(env, (NURO_RESUME_FROM, NURO_MAX_REQUEUES, NURO_PREEMPT_SIGNAL, NURO_SPARE_NODES)),
        *export_lines(env, (NURO_DEEPSPEED_CONFIG,)),
        f"export NURO_STOP_SIGNAL={TIME_LIMIT_SIGNAL}",
        f"export NURO_EXIT_REQUEUE={EXIT_REQUEUE}",
        *HELPER_LINES,
        *_FINISH_LINES,
        "",
        f"# 2. stop signals, trapped from the start: {PREEMPT_SIGNAL} = preemption (the controller signals the "
        f"steps itself), {TIME_LIMIT_SIGNAL} = time limit near (forwarded to the step once)",
        "NURO_STOP_REASON=",
        "NURO_STEP_PID=",
        f"trap 'NURO_STOP_REASON=preempted' {PREEMPT_SIGNAL}",
        f'trap \'NURO_STOP_REASON=time_limit; [ -z "$NURO_STEP_PID" ] || kill -{TIME_LIMIT_SIGNAL} "$NURO_STEP_PID"\' '
        f"{TIME_LIMIT_SIGNAL}",
        "",
        f"# 3. code: exactly {code_pin_text(pins.code)} (git archive; read-only on the repository)",
        *checkout_lines(pins.code),
        '[ -z "$NURO_STOP_REASON" ] || nuro_finish "$NURO_EXIT_REQUEUE"  # stopped before the launch',
        "",
        *_launch_lines(spec, facts),
        "",
        *_WAIT_LINES,
    ]
    script = "\n".join(head + body) + "\n"
    return SbatchRequest(script=script, args=(f"--comment={comment}",), comment=comment, output_dir=run_dir, meta=meta)


__all__ = [
    "HELPER_LINES",
    "ClusterFacts",
    "Pins",
    "RenderError",
    "SbatchRequest",
    "checkout_lines",
    "code_exports",
    "code_pin_text",
    "render_submission",
    "run_metadata",
    "slurm_time",
]
