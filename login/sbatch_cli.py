"""``nuro-sbatch``: plain sbatch plus nuro's platform flags (team, tier, dataset, code, checkpoint policy).

    nuro-sbatch [platform flags and sbatch options, any order] [SCRIPT [SCRIPT ARGS...]]

Flag rules (see docs/submit.md):

1. Platform flags (``--team --tier --dataset --data-seed --code REPO[@COMMIT] --commit --allow-dirty
   --spare-nodes --launcher --deepspeed-config --ckpt-interval --ckpt-keep --snapshot-interval --resume-from
   --max-requeues --run-root``, plus ``--dry-run`` and ``--policy``) are read only
   *before* the script, like every sbatch option; after the script everything is the script's own argument.
2. Platform flags must be spelled in full. sbatch accepts unique prefixes of its options, so an abbreviation of a
   platform flag (``--tea``, ``--comm``) is refused instead of guessed: it could mean either.
3. Every other option is sbatch's, read with sbatch 22.05's own table (``nuro.jobspec.sbatch_args``) only to find
   the script, and passed through untouched, in order, after nuro's ``--account``/``--qos``/``--comment``.
4. ``--team`` conflicts with a different ``-A/--account``, ``--tier`` with a different ``-q/--qos`` (command line or
   ``#SBATCH`` lines), and any platform flag with ``--comment`` (the comment is nuro's record): refused, never merged.
5. Without platform flags (and without ``--dry-run``) nuro-sbatch *is* sbatch: it execs it with the same argv.
6. ``--spare-nodes K`` adds ``--nodes=<N+K> --no-kill`` after the user's words (N: the job's own ``-N``, a fixed
   count) and exports ``NURO_SPARE_NODES``: ``nuro-launch --step -- srun ...`` in the script trains on N and swaps a
   spare in for a lost node (``nuro.wrappers.spares``).
7. ``--dataset`` and ``--code`` go together: the run record (``--comment``) pins both or is not written (the bridge
   refuses a record missing either). ``--team``/``--tier`` alone only set the account and QOS.
8. ``--deepspeed-config PATH`` (relative to the ``--code`` repository; ``--launcher deepspeed`` is implied) is
   checked at submit like nuro-train's (``nuro.jobspec.dsconfig``: JSON, batch sizes at ``-N`` × GPUs (or tasks)
   per node, what the installed DeepSpeed refuses), recorded in the run record and exported as
   ``NURO_DEEPSPEED_CONFIG`` for the script to pass to ``deepspeed.initialize``.

With ``--code`` the job runs exactly the pinned commit: nuro inserts a preamble (the same checkout code as
``nuro-train submit``) after the script's ``#SBATCH`` header and submits that copy; the user's lines follow
unchanged. The preamble ends in the matching directory of the checkout when the job's working directory is inside
the repository. sh/bash scripts only (the preamble is POSIX sh). Exit codes: sbatch's own (0 submitted, 1 refused),
2 usage, 3 invalid platform value or pin; ``--dry-run``: 0 the preview accepts (or no policy), 1 it rejects.

The run record and the job's ``NURO_*`` variables come from ``nuro.jobspec.record``, as for ``nuro-train submit``;
the command line goes to Slurm through the adapter (``nuro.slurm.SubmitCommand``), unchanged, sbatch's output and exit
status the user's own.

``-h``/``--help`` (before the script) prints nuro's platform flags, then sbatch's own help (``sbatch --help``, with
the same argv when there are no platform flags), and exits 0.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from nuro import names
from nuro.console import ExitCode, quiet_on_closed_pipe, say
from nuro.jobspec.codepin import CodePin, CodePinError, pin_code
from nuro.jobspec.fields import AbsPath, FieldError, Flag, RelPath
from nuro.jobspec.options import OPTIONS_BY_NAME, SPEC_OPTIONS, Opt
from nuro.jobspec.pins import DatasetPin, PinError, resolve_dataset, store_configured, store_diff
from nuro.jobspec.preview import PreviewError, decide_words, describe, load_policy_source, user_team
from nuro.jobspec.record import comment_json, export_lines, job_env, run_record
from nuro.jobspec.render import HELPER_LINES, checkout_lines, code_exports
from nuro.jobspec.sbatch_args import (
    SbatchArgError,
    Word,
    admission_args,
    is_option,
    parse_options,
    read_option,
    script_directives,
)
from nuro.jobspec.spec import SpecError, split_code_flag
from nuro.jobspec.submission import DEFAULT_RUN_ROOT, InvalidSubmission, deepspeed_notes, requeue_args
from nuro.policy.admission import parse_sbatch_args
from nuro.slurm import Backend, CliBackend, CliWrites, SlurmCommandNotFound, SlurmError, SubmitCommand

PROG = "nuro-sbatch"
PLATFORM: dict[str, Opt] = {o.flag: o for o in SPEC_OPTIONS if o.sbatch}
OWN_FLAGS = {"--dry-run": False, "--policy": True}  # flag → takes a value
HELP_COLUMNS = 100
ALL_FLAGS = (*PLATFORM, *OWN_FLAGS)
SH_INTERPRETERS = ("/bin/sh", "/bin/bash", "/usr/bin/sh", "/usr/bin/bash", "/bin/dash", "/usr/bin/env bash",
                   "/usr/bin/env sh")  # fmt: skip


class UsageError(Exception):
    """Exit 2: the command line cannot be split as documented."""


@dataclass
class Parsed:
    platform: dict[str, Any] = field(default_factory=dict)  # flag → raw value (True for flags)
    words: list[Word] = field(default_factory=list)  # sbatch options, in order
    script: str | None = None
    script_args: list[str] = field(default_factory=list)
    double_dash: bool = False


def split_argv(argv: Sequence[str]) -> Parsed:
    """Split nuro-sbatch's argv into platform flags, sbatch options and the script part (rules 1-3)."""
    p = Parsed()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == ":":
            raise SbatchArgError("heterogeneous jobs (':' between components) cannot carry nuro's platform flags")
        if arg == "--" or not is_option(arg):
            p.double_dash = arg == "--"
            rest = list(argv[i + 1 :] if p.double_dash else argv[i:])
            p.script, p.script_args = (rest[0], rest[1:]) if rest else (None, [])
            return p
        name, eq, value = arg.partition("=")
        if name in PLATFORM or name in OWN_FLAGS:
            takes_value = OWN_FLAGS[name] if name in OWN_FLAGS else not isinstance(PLATFORM[name].kind, Flag)
            if name in p.platform:
                raise UsageError(f"{name} given twice")
            if not takes_value:
                if eq:
                    raise UsageError(f"{name} takes no value, got {arg!r}")
                p.platform[name] = True
                i += 1
                continue
            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError(f"{name} needs a value")
                value = argv[i + 1]
                i += 1
            p.platform[name] = value
            i += 1
            continue
        if arg.startswith("--") and len(name) >= 4:
            full = [f for f in ALL_FLAGS if f.startswith(name)]
            if full:
                raise UsageError(
                    f"{name} abbreviates nuro's {' / '.join(full)}: spell platform flags in full (an abbreviation "
                    "could also be one of sbatch's options)"
                )
        word, i = read_option(argv, i)
        p.words.append(word)
    return p


def platform_values(p: Parsed) -> tuple[dict[str, Any], list[str]]:
    """Check the platform values with the job spec's own kinds; returns (values by option name, problems)."""
    values: dict[str, Any] = {}
    problems: list[str] = []
    for flag, raw in p.platform.items():
        opt = PLATFORM.get(flag)
        if opt is None:
            continue
        try:
            if flag == "--code":
                for name, part in split_code_flag(raw).items():
                    values[name] = PLATFORM["--commit" if name == "code.commit" else "--code"].parse(part)
            else:
                values[opt.name] = opt.parse(raw)
        except FieldError as exc:
            problems.append(f"{flag}: {exc}")
        except SpecError as exc:
            problems += [f"{flag}: {line}" for line in exc.problems]
    if "--commit" in p.platform and "code.commit" in values and p.platform["--commit"] != values["code.commit"]:
        problems.append("--commit: conflicts with the commit given in --code REPO@COMMIT")
    for name in ("code.commit", "code.allow_dirty"):
        if name in values and "code.repo" not in values:
            problems.append(f"{name}: needs --code REPO")
    if ("dataset" in values) != ("code.repo" in values):
        given, missing = ("--dataset", "--code") if "dataset" in values else ("--code", "--dataset")
        problems.append(
            f"{given}: needs {missing} too: a run record pins both the dataset and the code (the job_submit bridge "
            "refuses a record without either); give neither for a job without a record"
        )
    if values.get("code.allow_dirty") and values.get("code.commit"):
        problems.append("--allow-dirty: only applies to HEAD; drop the commit or --allow-dirty")
    config, launcher = values.get("entrypoint.deepspeed_config"), values.get("entrypoint.launcher")
    if config and "code.repo" not in values:
        problems.append("--deepspeed-config: needs --code REPO (the path is relative to the pinned repository)")
    if launcher == "deepspeed" and not config:
        problems.append("--launcher deepspeed: needs --deepspeed-config PATH (checked at submit, exported to the "
                        "job as NURO_DEEPSPEED_CONFIG)")  # fmt: skip
    if launcher == "torchrun" and config:
        problems.append("--deepspeed-config: given with --launcher torchrun; use --launcher deepspeed")
    return values, problems


def world_size(words: Sequence[Word]) -> int:
    """The job's training processes as its sbatch options say, for the DeepSpeed batch check: nodes (-N, the lower
    end of a range) × processes per node (GPUs per node from --gpus-per-node/--gres, else --ntasks-per-node, else 1),
    read by the admission preview's own sbatch parser."""
    try:
        req = parse_sbatch_args("", admission_args(words))
    except ValueError:  # a value sbatch itself will refuse with its own message
        return 1
    return (req.nodes or 1) * (req.gpus_per_node or req.tasks_per_node or 1)


def _default(name: str) -> Any:
    return next(o.default for o in SPEC_OPTIONS if o.name == name)


def platform_metadata(values: dict[str, Any], team: str, dataset: DatasetPin | None, code: CodePin | None) -> dict:
    """The ``nuro`` record for a nuro-sbatch job (``nuro.jobspec.record.run_record``, as nuro-train builds it; no
    name or entry: the script is the user's)."""
    return run_record(
        via="nuro-sbatch",
        team=team,
        tier=values.get("tier"),
        dataset=dataset,
        code=code,
        ckpt_interval_s=values.get("checkpoint.interval_s", _default("checkpoint.interval_s")),
        ckpt_keep=values.get("checkpoint.keep", _default("checkpoint.keep")),
        snapshot_interval_s=values.get("checkpoint.snapshot_interval_s", 0),
        resume_from=values.get("resume_from"),
        max_requeues=values.get("max_requeues", _default("max_requeues")),
        data_seed=values.get("data_seed", _default("data_seed")),
        spare_nodes=values.get("spare_nodes", 0),
        entry=_entry(values),
    )


def _entry(values: dict[str, Any]) -> dict[str, Any] | None:
    """The record's entry for a nuro-sbatch job: only the launcher and its DeepSpeed config (the script is the
    user's own)."""
    config = values.get("entrypoint.deepspeed_config")
    launcher = values.get("entrypoint.launcher") or ("deepspeed" if config else None)
    if launcher is None:
        return None
    return {"launcher": launcher, **({"deepspeed_config": config} if config else {})}


def spare_args(spares: int, words: Sequence[Word]) -> list[str]:
    """``--nodes=<N+K> --no-kill`` for ``--spare-nodes K``, placed after the user's own words (sbatch's last
    ``--nodes`` wins): the job's N nodes (its last ``-N/--nodes``, command line over ``#SBATCH``; 1 when none) plus
    the spares, and a lost node leaves the job instead of ending it (``nuro-launch --step`` swaps in a spare).

    Raises:
        UsageError: the node count is a range or not a number (the spares need one fixed training size).
    """
    if not spares:
        return []
    given = next((w.value for w in reversed(words) if w.name == "nodes"), None)
    if given is not None and not names.is_decimal(given.strip()):
        raise UsageError(f"--spare-nodes needs a fixed node count, got --nodes={given}: give -N <count> (the nodes "
                         "that train; the spares come on top)")  # fmt: skip
    nodes = int(given) if given is not None else 1
    return [f"--nodes={nodes + spares}", "--no-kill"]


def render_preamble(meta: dict[str, Any], code: CodePin, run_root: str, workdir_rel: str | None) -> str:
    """The POSIX sh inserted after the script's #SBATCH header: NURO_* exports, the checkout, the cd. Pure."""
    env = job_env(meta)
    lines = [
        "# --- nuro-sbatch: run metadata and the pinned code; your script continues unchanged below ---",
        *export_lines(env, sorted(env)),
        *code_exports(code, shlex.quote(f"{run_root}/sbatch")),
        *HELPER_LINES,
        *checkout_lines(code),
    ]
    if workdir_rel is not None:
        target = '"$NURO_CODE_DIR"' + (f"/{shlex.quote(workdir_rel)}" if workdir_rel != "." else "")
        lines.append(f'cd {target} || nuro_fail "cannot enter the checkout ({workdir_rel})"')
    lines.append("# --- end of the nuro-sbatch preamble ---")
    return "\n".join(lines) + "\n"


def insert_preamble(script: str, preamble: str) -> str:
    """``script`` with ``preamble`` after its shebang + #SBATCH/comment header (sbatch stops reading directives at
    the first command, so the header must stay first)."""
    lines = script.splitlines(keepends=True)
    first = lines[0].strip() if lines else ""
    if not any(first == f"#!{interp}" or first.startswith(f"#!{interp} ") for interp in SH_INTERPRETERS):
        raise UsageError(
            f"--code needs a sh or bash batch script (the checkout preamble is POSIX sh); this one starts with "
            f"{first[:60]!r}. Call your program from a bash script."
        )
    cut = 1
    while cut < len(lines) and (not lines[cut].strip() or lines[cut].lstrip().startswith("#")):
        cut += 1
    head = "".join(lines[:cut])
    if not head.endswith("\n"):
        head += "\n"
    return head + preamble + "".join(lines[cut:])


def _workdir_rel(words: list[Word], repo: str) -> str | None:
    chdir = next((w.value for w in reversed(words) if w.name == "chdir" and w.value), None)
    workdir = os.path.realpath(os.path.join(os.getcwd(), chdir) if chdir else os.getcwd())
    top = os.path.realpath(repo)
    if workdir != top and not workdir.startswith(top + os.sep):
        return None
    rel = os.path.relpath(workdir, top)
    try:
        return rel if rel == "." else RelPath().parse(rel)
    except FieldError:
        return None


def conflicts(values: dict[str, Any], words: list[Word], team: str | None) -> list[str]:
    problems = []
    for w in words:
        if w.name == "account" and team and w.value != team:
            problems.append(f"--team {team} conflicts with --account={w.value}: give one of them")
        if w.name == "qos" and values.get("tier") and w.value != values["tier"]:
            problems.append(f"--tier {values['tier']} conflicts with --qos={w.value}: give one of them")
        if w.name == "comment":
            problems.append("--comment cannot be combined with platform flags: the job comment is nuro's run record")
    return problems


def _user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def _read_script(parsed: Parsed, wrap: Word | None) -> tuple[str, bytes | None]:
    """The batch script's text and, when it came on stdin, the bytes to hand on to sbatch."""
    if wrap is not None:
        return f"#!/bin/sh\n{wrap.value}\n", None  # what sbatch --wrap builds, less its comment line
    if parsed.script is not None:
        try:
            with open(parsed.script, "rb") as fh:
                return fh.read().decode("utf-8", "surrogateescape"), None
        except OSError as exc:
            raise UsageError(f"cannot read the batch script {parsed.script}: {exc.strerror}") from exc
    data = sys.stdin.buffer.read()
    return data.decode("utf-8", "surrogateescape"), data


def _preview(words: list[Word], user: str, source: Any) -> int:
    if source is None:
        print("bridge preview: no policy (give --policy PATH or set NURO_POLICY to a teams.yaml)")
        return ExitCode.OK
    try:
        admission = decide_words(words, user, source)
    except ValueError as exc:
        print(f"bridge preview: cannot read this job for the preview: {exc}")
        return ExitCode.OK
    print("\n".join(describe(admission, source, user)))
    return ExitCode.OK if admission.accepted else ExitCode.FAILED


def platform_help() -> str:
    """nuro's part of ``--help``: the platform flags from the job spec's table (help, default), the rules. Pure."""
    lines = [
        "usage: nuro-sbatch [platform flags and sbatch options, any order] [SCRIPT [SCRIPT ARGS...]]",
        "",
        "nuro platform flags (before the script, spelled in full; any other option is sbatch's, passed through",
        "untouched; without platform flags nuro-sbatch is plain sbatch):",
    ]
    rows = []
    for opt in PLATFORM.values():
        head = f"{opt.flag} {opt.metavar_text}".rstrip()
        text = opt.help
        if "default" in text.lower():
            pass  # the help line already says it
        elif not opt.required and opt.default not in (None, False, ()):
            text += f" Default: {opt.default_doc or opt.default}{' ' + opt.unit if opt.unit else ''}."
        elif opt.default_doc:
            text += f" Default: {opt.default_doc}."
        rows.append((head, text))
    rows += [
        (
            "--dry-run",
            "Print the sbatch argv, the script as submitted (with --code) and the bridge's verdict; submit nothing.",
        ),
        ("--policy PATH", "teams.yaml for --dry-run's preview (default: $NURO_POLICY)."),
    ]
    width = max(len(head) for head, _ in rows) + 2
    for head, text in rows:
        wrapped = textwrap.wrap(text, HELP_COLUMNS - 2 - width) or [""]
        lines.append(f"  {head.ljust(width)}{wrapped[0]}")
        lines += [" " * (2 + width) + more for more in wrapped[1:]]
    lines += [
        "",
        "--team sets --account, --tier sets --qos (a different -A/-q is refused); --dataset and --code together",
        "write the run record into --comment (so --comment cannot be combined with them). See docs/submit.md.",
        "Exit codes: sbatch's own (0 submitted, 1 refused), 2 usage, 3 invalid platform value or pin.",
        "",
        "sbatch's own options:",
    ]
    return "\n".join(lines) + "\n"


def _help(sbatch_argv: list[str]) -> int:
    """Print nuro's flags, then run ``sbatch_argv`` (sbatch's help) below them; exit 0 when nuro's part printed.

    sbatch's help is run, not exec'd, so its absence (or sbatch refusing to start without a Slurm configuration)
    is said in one line instead of replacing nuro's help."""
    sys.stdout.write(platform_help())
    sys.stdout.flush()
    try:
        res = subprocess.run(sbatch_argv, check=False, timeout=10)  # sbatch retries a missing slurm.conf 60 s
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"  ({shlex.join(sbatch_argv)} did not print its help: {exc})")
        return ExitCode.OK
    if res.returncode != 0:
        print(f"  ({shlex.join(sbatch_argv)} exited {res.returncode}: it needs a Slurm configuration, e.g. SLURM_CONF)")
    return ExitCode.OK


def _wants_help(words: Sequence[Word]) -> bool:
    return any(w.name == "help" for w in words)


@dataclass(frozen=True)
class RunSbatch:
    """Nothing of nuro's to do (rule 5, or a usage error sbatch reports itself): sbatch runs with this argv."""

    argv: list[str]


@dataclass(frozen=True)
class Refused:
    """Exit ``code`` with ``message`` before anything ran."""

    code: int
    message: str


@dataclass(frozen=True)
class ShowHelp:
    """nuro's flags, then sbatch's own help (``sbatch_argv``)."""

    sbatch_argv: list[str]


@dataclass(frozen=True)
class Submission:
    """What one nuro-sbatch call submits, decided before anything is submitted (``plan``), rendered to sbatch's argv
    (``render``), run once (``execute``) or shown (``--dry-run``: the argv, the script as submitted, the preview).

    ``new_script``: the user's script with nuro's preamble, submitted as a private copy named ``script_name`` (Slurm's
    default job name stays plain sbatch's); None: the script goes to sbatch as the user gave it."""

    front: tuple[str, ...]  # nuro's words first: --account, --qos, --requeue=expedite, --comment
    words: tuple[str, ...]  # the user's sbatch options, untouched, in order
    tail: tuple[str, ...]  # after the user's words: the spares' --nodes and --no-kill
    lead: tuple[str, ...]  # ("--",) when the user wrote it before the script
    script: str | None
    script_args: tuple[str, ...]
    script_name: str
    new_script: str | None
    preamble: str | None
    stdin_bytes: bytes | None
    preview_words: tuple[Word, ...]
    user: str
    source: Any
    env: dict[str, str]
    dry_run: bool


def render(sub: Submission, script_path: str | None = None) -> list[str]:
    """sbatch's argv for ``sub``; ``script_path``: where the rewritten script was written (dry run: its name). Pure."""
    given = [sub.script] if sub.script else []
    script = [script_path or sub.script_name] if sub.new_script is not None else given
    return ["sbatch", *sub.front, *sub.words, *sub.tail, *sub.lead, *script, *sub.script_args]


def plan(args: list[str]) -> Submission | RunSbatch | Refused | ShowHelp:
    """Decide what this command line submits (rules 1-8): every check, pin and record before anything is
    submitted. Reads the script, the policy, git and (for a dataset tag) S3; runs nothing of Slurm's but the
    version query for ``--requeue=expedite``."""
    try:
        parsed = split_argv(args)
    except UsageError as exc:
        return Refused(ExitCode.USAGE, str(exc))
    except SbatchArgError as exc:
        if not any(a.partition("=")[0] in ALL_FLAGS for a in args):
            return RunSbatch(["sbatch", *args])  # rule 5: sbatch reports its own usage errors
        return Refused(ExitCode.USAGE, str(exc))
    if _wants_help(parsed.words):  # sbatch's help after nuro's; its argv untouched unless nuro flags are in it
        return ShowHelp(["sbatch", *args] if not parsed.platform else ["sbatch", "--help"])
    if not parsed.platform:
        return RunSbatch(["sbatch", *args])
    dry_run = bool(parsed.platform.get("--dry-run"))
    has_platform = any(flag in PLATFORM for flag in parsed.platform)
    lead = ("--",) if parsed.double_dash else ()
    tokens = tuple(t for w in parsed.words for t in w.tokens)
    plain = Submission((), tokens, (), lead, parsed.script, tuple(parsed.script_args), "", None, None, None, (), "",
                       None, {}, dry_run)  # fmt: skip
    if not has_platform and not dry_run:  # only --policy: plain sbatch (before stdin is read: sbatch reads it)
        return RunSbatch(render(plain))
    values, problems = platform_values(parsed)
    if problems:
        return Refused(ExitCode.INVALID, "invalid platform flags:\n" + "\n".join(f"  - {p}" for p in problems))
    wrap = next((w for w in parsed.words if w.name == "wrap"), None)
    try:
        script_text, stdin_bytes = _read_script(parsed, wrap)
        directives = parse_options(script_directives(script_text))
        source = load_policy_source(parsed.platform.get("--policy"))
    except (UsageError, SbatchArgError, PreviewError) as exc:
        return Refused(ExitCode.USAGE, str(exc))
    words = directives + parsed.words
    user = _user()
    if not has_platform:  # --dry-run of a plain sbatch command line
        return dataclasses.replace(plain, preview_words=tuple(words), user=user, source=source)
    team = values.get("team") or next((w.value for w in reversed(words) if w.name == "account"), None)
    team = team or user_team(source, user)
    if team is None:
        return Refused(
            ExitCode.USAGE, "--team is required (or --account, or --policy/NURO_POLICY listing you in a team)"
        )
    problems = conflicts(values, words, values.get("team"))
    if problems:
        return Refused(ExitCode.USAGE, "\n".join(problems))
    try:
        team = OPTIONS_BY_NAME["team"].parse(team)
        dataset = resolve_dataset(values["dataset"]) if "dataset" in values else None
        code = None
        if "code.repo" in values:
            config = values.get("entrypoint.deepspeed_config")
            code = pin_code(
                values["code.repo"], values.get("code.commit"), allow_dirty=values.get("code.allow_dirty", False),
                require_paths=[config] if config else [],
            )  # fmt: skip
            if code.diff is not None and store_configured() and not dry_run:
                code = store_diff(code, team)
        if values.get("entrypoint.deepspeed_config") and code is not None:
            for note in deepspeed_notes(values["entrypoint.deepspeed_config"], code, world_size(words)):
                print(f"{PROG}: note: {note}", file=sys.stderr)
        run_root = values.get("run_root") or AbsPath().parse(os.path.expanduser(DEFAULT_RUN_ROOT))
    except (FieldError, PinError, CodePinError) as exc:
        return Refused(ExitCode.INVALID, str(exc))
    except InvalidSubmission as exc:
        return Refused(ExitCode.INVALID, "\n".join(exc.problems))
    meta = platform_metadata(values, team, dataset, code)
    env = job_env(meta)
    front = [f"--account={team}", *([f"--qos={values['tier']}"] if values.get("tier") else [])]
    front += expedited_requeue(CliBackend(env=env))
    if dataset is not None and code is not None:  # a record only with both pins (rule 7)
        try:
            front.append(f"--comment={comment_json(meta)}")
        except ValueError as exc:  # over Slurm's 1,024 bytes: refused before sbatch, with what to shorten
            return Refused(ExitCode.INVALID, f"the run record does not fit the job comment: {exc}")
    try:
        tail = spare_args(values.get("spare_nodes", 0), words)
    except UsageError as exc:
        return Refused(ExitCode.USAGE, str(exc))
    new_script = preamble = None
    if code is not None:
        tokens = tuple(t for w in parsed.words if w is not wrap for t in w.tokens)
        try:
            preamble = render_preamble(meta, code, run_root, _workdir_rel(words, code.repo))
            new_script = insert_preamble(script_text, preamble)
        except UsageError as exc:
            return Refused(ExitCode.USAGE, str(exc))
        stdin_bytes = None  # the rewritten script goes as a file
    # Same file name as the user's script: Slurm's default job name (the script's base name; "wrap" for --wrap,
    # "sbatch" for stdin) stays what plain sbatch would give.
    name = "wrap" if wrap is not None else os.path.basename(parsed.script or "") or "sbatch"
    preview = (*directives, *parse_options(front), *parsed.words, *parse_options(tail))
    return Submission(tuple(front), tokens, tuple(tail), lead, parsed.script, tuple(parsed.script_args), name,
                      new_script, preamble, stdin_bytes, preview, user, source, env, dry_run)  # fmt: skip


def show(sub: Submission) -> int:
    """``--dry-run``: the argv sbatch would get, the script as it would be submitted, the bridge's verdict."""
    print("sbatch argv:", shlex.join(render(sub)))
    if sub.new_script is not None:
        print(f"script {sub.script_name} as submitted (nuro's preamble after the #SBATCH header):")
        print(sub.new_script, end="" if sub.new_script.endswith("\n") else "\n")
    return _preview(list(sub.preview_words), sub.user, sub.source)


def execute(sub: Submission, backend: CliWrites) -> int:
    """Submit ``sub`` once through the adapter; sbatch's own status and output are the user's."""
    tmp_dir = None
    try:
        path = None
        if sub.new_script is not None:
            tmp_dir = tempfile.mkdtemp(prefix="nuro-sbatch-")
            path = os.path.join(tmp_dir, sub.script_name)
            with open(path, "w", encoding="utf-8", errors="surrogateescape") as fh:
                fh.write(sub.new_script)
        return backend.submit_command(SubmitCommand(tuple(render(sub, path)[1:]), sub.stdin_bytes))
    except SlurmCommandNotFound:
        return say(ExitCode.FAILED, "sbatch not found on PATH", prog=PROG)
    finally:
        if tmp_dir:
            shutil.rmtree(tmp_dir, ignore_errors=True)


@quiet_on_closed_pipe
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: plan, then run sbatch as is, refuse, show help, show the dry run or submit; returns the exit
    code (see the module docstring)."""
    decided = plan(list(sys.argv[1:] if argv is None else argv))
    if isinstance(decided, RunSbatch):
        os.execvp("sbatch", decided.argv)
    if isinstance(decided, Refused):
        return say(decided.code, decided.message, prog=PROG)
    if isinstance(decided, ShowHelp):
        return _help(decided.sbatch_argv)
    if decided.dry_run:
        return show(decided)
    return execute(decided, CliBackend(env=decided.env))


def expedited_requeue(backend: Backend) -> list[str]:
    """``--requeue=expedite`` before the user's own words where the cluster has it (25.11+): a training job hit by
    a node failure restarts at once. The user's own ``--requeue``/``--no-requeue`` comes later and wins (the bridge
    forces requeue on team jobs either way). No Slurm to ask (a dry run on a laptop): nothing added."""
    try:
        return requeue_args(backend)
    except SlurmError:
        return []


if __name__ == "__main__":
    sys.exit(main())
