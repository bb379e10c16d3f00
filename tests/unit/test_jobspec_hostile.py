"""Hostile values in every user-controlled field are refused with a message naming the field (principle 4).

One table: every field × every hostile value. A few (field, value) pairs are legitimately valid (an absolute path
where an absolute path is expected, an argument that starts with a dash) and are listed in ALLOWED with the reason.
The same values go through nuro-sbatch's platform flags, which must refuse them before anything runs.
"""

from __future__ import annotations

import pytest

from nuro.jobspec import SpecError, build_spec
from nuro.jobspec.fields import SHOW_MAX
from nuro.login.sbatch_cli import platform_values, split_argv

DIGEST = "sha256:" + "ab" * 32
BASE = {
    "name": "r1",
    "team": "perception",
    "dataset": f"imagenet@{DIGEST}",
    "code.repo": "/shared/vision",
    "entrypoint.script": "train.py",
}

HOSTILE = {
    "semicolon": "x;touch /tmp/pwned",
    "subst": "$(touch /tmp/pwned)",
    "backtick": "`touch /tmp/pwned`",
    "pipe": "a|sh",
    "ampersand": "a&&b",
    "redirect": "a>/tmp/pwned",
    "newline": "a\ntouch /tmp/pwned",
    "carriage": "a\rb",
    "nul": "a\x00b",
    "traversal": "../../etc/passwd",
    "traversal_mid": "a/../../b",
    "absolute": "/etc/passwd",
    "dash": "-rf",
    "space": "a b",
    "quote": "a'b\"c",
    "glob": "a*",
    "dollar": "$HOME",
    "long": "a" * 10240,
    "rtl": "abc\u202edcba",
    "fullwidth": "\uff41\uff42",
    "unicode_digit": "\u0661\u0662",
    "empty": "",
    "tab": "a\tb",
}

#: Where the field is a value placed into the spec (env entries are a name or a value of one variable).
FIELDS = {
    "name": lambda v: {"name": v},
    "team": lambda v: {"team": v},
    "tier": lambda v: {"tier": v},
    "dataset": lambda v: {"dataset": v},
    "dataset_name": lambda v: {"dataset": f"{v}@{DIGEST}"},
    "dataset_tag": lambda v: {"dataset": f"imagenet@{v}"},
    "code.repo": lambda v: {"code.repo": v},
    "code.commit": lambda v: {"code.commit": v},
    "entrypoint.script": lambda v: {"entrypoint.script": v},
    "entrypoint.args": lambda v: {"entrypoint.args": ["--ok", v]},
    "entrypoint.deepspeed_config": lambda v: {"entrypoint.deepspeed_config": v},
    "entrypoint.python": lambda v: {"entrypoint.python": v},
    "env_name": lambda v: {"env": {v: "1"}},
    "env_value": lambda v: {"env": {"MY_VAR": v}},
    "env_list": lambda v: {"env": [f"MY_VAR={v}"]},
    "resume_from": lambda v: {"resume_from": v},
    "run_root": lambda v: {"run_root": v},
    "time_limit": lambda v: {"time_limit": v},
    "nodes": lambda v: {"nodes": v},
    "gpus_per_node": lambda v: {"gpus_per_node": v},
    "checkpoint.interval_s": lambda v: {"checkpoint.interval_s": v},
    "checkpoint.keep": lambda v: {"checkpoint.keep": v},
    "max_requeues": lambda v: {"max_requeues": v},
    "stop_warning_s": lambda v: {"stop_warning_s": v},
}
#: The option name the error line must start with, when it differs from the field id.
PREFIX = {"dataset_name": "dataset", "dataset_tag": "dataset", "env_name": "env", "env_value": "env", "env_list": "env"}
ALLOWED = {
    ("code.repo", "absolute"): "an absolute path is what code.repo expects",
    ("run_root", "absolute"): "an absolute path is what run_root expects",
    ("entrypoint.python", "absolute"): "an interpreter may be given by absolute path",
    ("entrypoint.args", "dash"): "script arguments are often flags",
    ("entrypoint.args", "absolute"): "script arguments may be paths (the user's own code reads them)",
    ("entrypoint.args", "empty"): "an empty argument is a valid argv element",
    ("env_value", "dash"): "a value may start with a dash",
    ("env_value", "absolute"): "a value may be a path",
    ("env_value", "empty"): "an empty value is valid",
    ("env_list", "dash"): "a value may start with a dash",
    ("env_list", "absolute"): "a value may be a path",
    ("env_list", "empty"): "an empty value is valid",
}
CASES = [(f, h) for f in FIELDS for h in HOSTILE if (f, h) not in ALLOWED]


@pytest.mark.parametrize(("field", "hostile"), CASES, ids=[f"{f}-{h}" for f, h in CASES])
def test_hostile_value_is_refused_naming_the_field(field: str, hostile: str) -> None:
    with pytest.raises(SpecError) as info:
        build_spec(BASE, FIELDS[field](HOSTILE[hostile]))
    prefix = PREFIX.get(field, field) + ":"
    lines = [p for p in info.value.problems if p.startswith(prefix)]
    assert lines, f"no problem names {prefix!r}: {info.value.problems}"
    for line in lines:
        # Printable ASCII only (no raw newline, NUL, RTL override) and short, whatever came in.
        assert line.isascii() and line.isprintable(), repr(line)
        assert len(line) < 400 + SHOW_MAX, len(line)


@pytest.mark.parametrize(("field", "hostile"), sorted(ALLOWED), ids=[f"{f}-{h}" for f, h in sorted(ALLOWED)])
def test_allowed_pairs_are_really_allowed(field: str, hostile: str) -> None:
    build_spec(BASE, FIELDS[field](HOSTILE[hostile]))


@pytest.mark.parametrize("raw", [True, -1, 10**12, 1.5, "1e3", "0x10", " 2", "2 ", [2], "two"])
def test_numbers_refuse_non_integers(raw: object) -> None:
    with pytest.raises(SpecError, match="nodes: must be"):
        build_spec(BASE, {"nodes": raw})


PLATFORM_FLAGS = ["--team", "--tier", "--dataset", "--code", "--commit", "--ckpt-interval", "--ckpt-keep",
                  "--resume-from", "--max-requeues", "--run-root"]  # fmt: skip


@pytest.mark.parametrize("flag", PLATFORM_FLAGS)
@pytest.mark.parametrize("hostile", ["semicolon", "subst", "backtick", "newline", "nul", "long", "rtl", "traversal"])
def test_nuro_sbatch_platform_flags_refuse_hostile_values(flag: str, hostile: str) -> None:
    value = HOSTILE[hostile]
    if flag == "--code" and hostile == "traversal":
        value = "../x"
    parsed = split_argv([f"{flag}={value}", "--code=/shared/vision", "job.sh"] if flag == "--commit" else
                        [f"{flag}={value}", "job.sh"])  # fmt: skip
    _values_, problems = platform_values(parsed)
    assert any(p.startswith(flag) for p in problems), problems
    assert all(p.isascii() and p.isprintable() for p in problems)
