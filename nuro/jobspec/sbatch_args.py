"""sbatch's command line as sbatch 22.05 reads it: which words are options (and their values), where the script is.

nuro-sbatch must pass plain sbatch options through untouched, yet it must know where the batch script starts (the
first word that is not an option or an option's value) and what the options mean for admission. Both need sbatch's
own option table, because ``-N 2 job.sh`` and ``--hold job.sh`` differ only in whether the option takes a value.

The table below is sbatch 22.05.8's (``src/common/slurm_opt.c``: the ``common_options`` entries sbatch accepts,
with their ``has_arg``), parsed the way ``getopt_long`` with a leading ``+`` does: options stop at the first
non-option word or at ``--``; long options may be abbreviated to a unique prefix; ``--opt=value`` or
``--opt value`` for required values, only ``--opt=value`` for optional ones; short options cluster (``-HvN2``).
A newer sbatch may know options this table does not: those are accepted in the ``--name=value`` form only.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# name: "r" required value, "o" optional value (only with '='), "n" no value; then the short letter if any.
_TABLE = """
account r A|acctg-freq r|array r a|batch r|begin r b|bb r|bbf r|cluster-constraint r|chdir r D|cluster r|clusters r M|
comment r|container r|context r|contiguous n|constraint r C|core-spec r S|cores-per-socket r|cpu-freq r|
cpus-per-gpu r|cpus-per-task r c|deadline r|delay-boot r|dependency r d|distribution r m|error r e|exclude r x|
exclusive o|export r|export-file r|extra-node-info r B|get-user-env o|gid r|gpu-bind r|gpu-freq r|gpus r G|
gpus-per-node r|gpus-per-socket r|gpus-per-task r|gres r|gres-flags r|help n h|hint r|hold n H|ignore-pbs n|
input r i|job-name r J|kill-on-invalid-dep r|licenses r L|mail-type r|mail-user r|mcs-label r|mem r|mem-bind r|
mem-per-cpu r|mem-per-gpu r|mincpus r|network r|nice o|no-kill o k|no-requeue n|nodefile r F|nodelist r w|
nodes r N|ntasks r n|ntasks-per-core r|ntasks-per-gpu r|ntasks-per-node r|ntasks-per-socket r|ntasks-per-tres r|
open-mode r|output r o|overcommit n O|oversubscribe n s|parsable n|partition r p|power r|prefer r|priority r|
profile r|propagate o|qos r q|quiet n Q|reboot n|requeue o|reservation r|signal r|sockets-per-node r|spread-job n|
switches r|tasks-per-node r|test-only n|thread-spec r|threads-per-core r|time r t|time-min r|tmp r|uid r|
use-min-nodes n|verbose n v|version n V|usage n|wait n W|wait-all-nodes r|wckey r|wrap r
"""


@dataclass(frozen=True)
class SbatchOpt:
    name: str
    has_arg: str  # "r", "o" or "n"
    short: str | None = None


def _load() -> tuple[dict[str, SbatchOpt], dict[str, SbatchOpt]]:
    by_long: dict[str, SbatchOpt] = {}
    by_short: dict[str, SbatchOpt] = {}
    for item in " ".join(_TABLE.split()).replace("| ", "|").strip("|").split("|"):
        parts = item.split()
        opt = SbatchOpt(parts[0], parts[1], parts[2] if len(parts) > 2 else None)
        by_long[opt.name] = opt
        if opt.short:
            by_short[opt.short] = opt
    return by_long, by_short


SBATCH_LONG, SBATCH_SHORT = _load()


class SbatchArgError(ValueError):
    """The command line cannot be read the way sbatch would read it."""


@dataclass(frozen=True)
class Word:
    """One option as given: ``name`` is sbatch's long name (None for an option this table does not know),
    ``value`` its value (None for none), ``tokens`` the exact argv words it took (passed through unchanged)."""

    name: str | None
    value: str | None
    tokens: tuple[str, ...]


def lookup_long(name: str) -> SbatchOpt | None:
    """Exact name or unique prefix, as getopt_long does. Raises SbatchArgError when ambiguous."""
    if name in SBATCH_LONG:
        return SBATCH_LONG[name]
    matches = [o for n, o in SBATCH_LONG.items() if n.startswith(name)]
    if len(matches) > 1:
        raise SbatchArgError(f"--{name} is ambiguous in sbatch: " + ", ".join(f"--{o.name}" for o in matches))
    return matches[0] if matches else None


def read_option(argv: Sequence[str], i: int) -> tuple[Word, int]:
    """The sbatch option starting at ``argv[i]`` and the index after it."""
    arg = argv[i]
    if arg.startswith("--"):
        name, eq, value = arg[2:].partition("=")
        opt = lookup_long(name)
        if opt is None:
            if eq:
                return Word(None, value, (arg,)), i + 1
            raise SbatchArgError(
                f"{arg} is not an sbatch 22.05 option; if your sbatch is newer, write it as {arg}=VALUE or put it "
                "on an #SBATCH line"
            )
        if eq:
            if opt.has_arg == "n":
                raise SbatchArgError(f"--{opt.name} takes no value, got {arg!r}")
            return Word(opt.name, value, (arg,)), i + 1
        if opt.has_arg == "r":
            if i + 1 >= len(argv):
                raise SbatchArgError(f"--{opt.name} needs a value")
            return Word(opt.name, argv[i + 1], (arg, argv[i + 1])), i + 2
        return Word(opt.name, None, (arg,)), i + 1
    # short options, possibly clustered: -HvN2, -N 2
    j = 1
    while j < len(arg):
        opt = SBATCH_SHORT.get(arg[j])
        if opt is None:
            raise SbatchArgError(f"-{arg[j]} (in {arg!r}) is not an sbatch option")
        if opt.has_arg == "n":
            j += 1
            continue
        rest = arg[j + 1 :]
        if rest or opt.has_arg == "o":
            return Word(opt.name, rest or None, (arg,)), i + 1
        if i + 1 >= len(argv):
            raise SbatchArgError(f"-{arg[j]} needs a value")
        return Word(opt.name, argv[i + 1], (arg, argv[i + 1])), i + 2
    if len(arg) == 2:
        return Word(SBATCH_SHORT[arg[1]].name, None, (arg,)), i + 1
    return Word(None, None, (arg,)), i + 1  # a cluster of flags only (-Hv): admission ignores them


def is_option(word: str) -> bool:
    return word.startswith("-") and word != "-"


def script_directives(text: str) -> list[str]:
    """The option words of the ``#SBATCH`` lines in a batch script's header, as sbatch reads them.

    sbatch stops at the first line that is neither blank nor a comment; a ``#`` after the options starts a comment.
    An approximation of sbatch's own quote handling (shlex), good for the admission preview and conflict checks.
    """
    words: list[str] = []
    for n, line in enumerate(text.splitlines()):
        stripped = line.strip()
        if n == 0 and stripped.startswith("#!"):
            continue
        if stripped and not stripped.startswith("#"):
            break
        if stripped.startswith("#SBATCH"):
            try:
                words += shlex.split(stripped[len("#SBATCH") :], comments=True)
            except ValueError:
                continue
    return words


def parse_options(words: Sequence[str]) -> list[Word]:
    """Every option in ``words`` (an #SBATCH header's words: no script position to find)."""
    out: list[Word] = []
    i = 0
    while i < len(words):
        if not is_option(words[i]):
            i += 1
            continue
        word, i = read_option(words, i)
        out.append(word)
    return out


#: sbatch options the admission preview reads (nuro.policy.admission.parse_sbatch_args understands these).
ADMISSION_VALUED = ("nodes", "ntasks", "ntasks-per-node", "sockets-per-node", "account", "qos", "gpus",
                    "gpus-per-node", "gpus-per-task", "gpus-per-socket", "gres", "switches", "comment")  # fmt: skip


def admission_args(words: Iterable[Word]) -> list[str]:
    """The options that matter for admission, last one winning (sbatch: command line over #SBATCH lines, later
    over earlier), normalised to ``--name=value`` for ``nuro.policy.admission.parse_sbatch_args``."""
    values: dict[str, str] = {}
    requeue: str | None = None
    for w in words:
        if w.name in ADMISSION_VALUED and w.value is not None:
            values[w.name] = w.value
        elif w.name in ("requeue", "no-requeue"):
            requeue = w.name
    return [f"--{k}={v}" for k, v in values.items()] + ([f"--{requeue}"] if requeue else [])


__all__ = [
    "ADMISSION_VALUED",
    "SBATCH_LONG",
    "SBATCH_SHORT",
    "SbatchArgError",
    "SbatchOpt",
    "Word",
    "admission_args",
    "is_option",
    "lookup_long",
    "parse_options",
    "read_option",
    "script_directives",
]
