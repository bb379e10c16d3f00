"""The real slurm_plugins/job_submit.lua under lua5.1 with a stub ``slurm`` table, for comments in bulk; and the
comment generator the property tests (tests/unit/test_comment_bridge.py, tests/integration/isolation/
test_comment_parse.py) and bench/bench_bridge.py share.

One lua5.1 process judges a whole batch: for each comment it prints the bridge's own ``scan`` verdict (found among
the upvalues of ``slurm_job_submit`` with the debug library, so the bridge file is loaded unchanged) and the result of
``slurm_job_submit`` for one job shape (code name + the user message). Fields are hex-encoded, so any byte survives.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nuro.policy.luatable import TABLE_FILE, lua_string
from nuro.protocol import jobcomment

REPO = Path(__file__).resolve().parents[1]
BRIDGE = REPO / "slurm_plugins" / "job_submit.lua"
LUA = shutil.which("lua5.1")
NO_VAL, NO_VAL16 = 4294967294, 65534

#: The stub ``slurm`` table (codes, NO_VAL markers, log_* collecting user messages and errors) and the bridge
#: loaded from ``arg[1]``: the first lines of every Lua driver of job_submit.lua in the tests and the bench.
STUB_PRELUDE = r"""
local CODES = { ESLURM_ACCESS_DENIED = 2002, ESLURM_ACCOUNTING_POLICY = 2050, ESLURM_INVALID_ACCOUNT = 2045 }
slurm = { SUCCESS = 0, ERROR = -1, NO_VAL = 4294967294, NO_VAL16 = 65534, INFINITE = 4294967295 }
for k, v in pairs(CODES) do slurm[k] = v end
local user_msg, errors = {}, {}
slurm.log_user = function(fmt, ...) table.insert(user_msg, string.format(fmt, ...)) end
slurm.log_info = function() end
slurm.log_debug = function() end
slurm.log_error = function(fmt, ...) table.insert(errors, string.format(fmt, ...)) end
assert(dofile(arg[1]) == slurm.SUCCESS)
"""

#: ``find(f, names)``: the first upvalue named in the set ``names``, searched through ``f``'s closures (how the
#: drivers reach the bridge's local functions without changing the file).
FIND_UPVALUE = r"""
local function find(f, names, seen)
  seen = seen or {}
  if seen[f] then return nil end
  seen[f] = true
  local i = 1
  while true do
    local n, v = debug.getupvalue(f, i)
    if not n then return nil end
    if names[n] then return v end
    if type(v) == "function" then
      local got = find(v, names, seen)
      if got then return got end
    end
    i = i + 1
  end
end
"""

_STUB = (
    STUB_PRELUDE
    + r"""
"""
    + FIND_UPVALUE
    + r"""
local scan = assert(find(slurm_job_submit, { scan = true }), "scan not found among the bridge's upvalues")
local function hex(s) return ((s or ""):gsub(".", function(c) return string.format("%02x", c:byte()) end)) end
local job = dofile(arg[2])
local comments = dofile(arg[3])
local mode = arg[4]
local out = {}
for n, c in ipairs(comments) do
  local obj, why = scan(c)
  local code, msg = "-", ""
  if mode ~= "scan" then
    user_msg, errors = {}, {}
    local d = {}
    for k, v in pairs(job) do d[k] = v end
    d.comment = c
    local rc = slurm_job_submit(d, {}, 1000)
    code = "SUCCESS"
    for k, v in pairs(CODES) do if v == rc then code = k end end
    msg = table.concat(user_msg, "\n") .. table.concat(errors, "\n")
  end
  out[#out + 1] = (obj and "1" or "0") .. "\t" .. hex(why) .. "\t" .. code .. "\t" .. hex(msg)
end
io.write(table.concat(out, "\n"), "\n")
"""
)


@dataclass(frozen=True)
class Verdict:
    """What one side says of one comment."""

    record: bool
    why: str | None
    code: str | None = None  # the submit's outcome: SUCCESS or the ESLURM_* name (None: not asked)
    message: str = ""


def lua_value(value: object) -> str:
    """A Python value (None, bool, int, str, dict) as a Lua literal: the stub job records and cases."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return lua_string(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"[{lua_string(k)}] = {lua_value(v)}" for k, v in value.items() if v is not None) + "}"
    raise TypeError(value)


def job_desc(user: str, gpus_per_node: int = 1) -> dict:
    """A job_desc as slurmctld 22.05.8 hands it for ``sbatch --gpus-per-node=N`` by ``user`` (no comment yet)."""
    return {
        "user_name": user, "user_id": 1000, "name": "wrap", "min_nodes": NO_VAL, "max_nodes": NO_VAL,
        "num_tasks": NO_VAL, "ntasks_per_node": NO_VAL16, "sockets_per_node": NO_VAL16,
        "tres_per_node": f"gres:gpu:{gpus_per_node}" if gpus_per_node else None, "requeue": NO_VAL16,
        "req_switch": NO_VAL, "wait4switch": NO_VAL,
    }  # fmt: skip


def run_bridge(
    comments: Sequence[str], table_text: str, job: dict | None = None, *, scan_only: bool = False
) -> list[Verdict]:
    """Judge ``comments`` with the real bridge in one lua5.1 process (``job``: the job_desc without its comment)."""
    if LUA is None:
        raise RuntimeError("lua5.1 is not installed (apt-get install lua5.1)")
    with tempfile.TemporaryDirectory(prefix="nuro-lua-") as tmp:
        d = Path(tmp)
        shutil.copy(BRIDGE, d / "job_submit.lua")
        (d / TABLE_FILE).write_text(table_text)
        (d / "job.lua").write_text("return " + lua_value(job or job_desc("alice")) + "\n")
        (d / "comments.lua").write_text("return {\n" + ",\n".join(lua_string(c) for c in comments) + "\n}\n")
        (d / "stub.lua").write_text(_STUB)
        argv = [LUA, str(d / "stub.lua"), str(d / "job_submit.lua"), str(d / "job.lua"), str(d / "comments.lua")]
        out = subprocess.run([*argv, "scan" if scan_only else "submit"], capture_output=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"lua5.1 failed: {out.stderr.decode(errors='replace')}")
    verdicts = []
    for line in out.stdout.decode().splitlines():
        rec, why, code, msg = line.split("\t")
        verdicts.append(
            Verdict(
                record=rec == "1",
                why=bytes.fromhex(why).decode() or None,
                code=None if code == "-" else code,
                message=bytes.fromhex(msg).decode(),
            )
        )
    if len(verdicts) != len(comments):
        raise RuntimeError(f"lua5.1 judged {len(verdicts)} of {len(comments)} comments")
    return verdicts


def python_scan(comment: str) -> Verdict:
    """The Python side's verdict: the definition (``record``) and the scanner's reason, which must agree."""
    rec = jobcomment.record(comment) is not None
    return Verdict(record=rec, why=jobcomment.scan(comment))


# --- the comment generator ----------------------------------------------------------------------------------------

_D, _C = "sha256:" + "3f" * 32, "0123456789abcdef0123456789abcdef01234567"
NURO = {
    "ckpt_policy": {"interval_s": 600, "keep": 3},
    "code": {"commit": _C, "repo": "/home/alice/src/vision"},
    "dataset": {"digest": _D, "name": "imagenet-mini"},
    "entry": {"args": ["--lr", "0.1"], "launcher": "torchrun", "script": "train.py"},
    "name": "resnet",
    "requeue": {"max": 3},
    "team": "perception",
    "v": 1,
}
_KEYS = ["nuro", "ckpt", "ack", "preempt", "refused", "user_comment", "team", "dataset", "digest", "name", "code",
         "commit", "a", "b", "", "nuro ", "Nuro", "é", "\U0001f600", "\uffff", "\x7f", "\n", '"', "\\"]  # fmt: skip
_TOKENS = ['{', '}', '[', ']', ':', ',', '"', '\\', 'u', '0072', '"nuro"', '"nu\\u0072o"', '"a"', '"b"', '1', '-0',
           '0', '1.5', '1e3', '01', 'true', 'false', 'null', ' ', '\n', '\t', '"\\u00e9"', '"\\u00E9"', '"\\/"',
           '"x"', 'é', '\x00', '\x7f', '9' * 16, '"\\ud83d\\ude00"', '"\\ud83d"', '"\\n"', '"\\u000a"']  # fmt: skip
_SPACES = [" ", "\n", "\t", "\r"]


def _value(rng: random.Random, depth: int) -> object:
    kind = rng.random()
    if depth > 3 or kind < 0.45:
        return rng.choice([
            None, True, False, 0, 1, -1, rng.randint(-10**15 + 1, 10**15 - 1), rng.randint(0, 2_000_000_000),
            rng.choice(_KEYS), "".join(rng.choice(["a", "é", "\x00", "\x7f", '"', "\\", "/", "\U0001f600", " "])
                                       for _ in range(rng.randint(0, 4))),
        ])  # fmt: skip
    if kind < 0.7:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(_KEYS): _value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def _record(rng: random.Random) -> dict:
    """A comment object: often a real nuro record (sometimes with a broken pin), channel keys beside it."""
    obj: dict = {}
    if rng.random() < 0.6:
        nuro = json.loads(json.dumps(NURO))
        r = rng.random()
        if r < 0.1:
            nuro["dataset"]["digest"] = "latest"
        elif r < 0.15:
            nuro["code"]["commit"] = "main"
        elif r < 0.2:
            nuro["team"] = "prediction"
        elif r < 0.25:
            del nuro["team"]
        elif r < 0.3:
            nuro["dataset"]["tag"] = "v1"
        elif r < 0.33:
            nuro = "sha256:" + "ab" * 32
        obj["nuro"] = nuro
    for key in ("ckpt", "ack", "refused", "user_comment", "preempt"):
        if rng.random() < (0.08 if key == "preempt" else 0.3):
            obj[key] = {"at": rng.randint(0, 2_000_000_000), "step": rng.randint(0, 10**6)}
    for _ in range(rng.randint(0, 2)):
        obj[rng.choice(_KEYS)] = _value(rng, 1)
    return obj


def _mutate(rng: random.Random, text: str) -> str:
    """One adversarial edit of a canonical text."""
    n = len(text)
    i = rng.randrange(n + 1)
    m = rng.randrange(12)
    if m == 0:  # a space or line break
        return text[:i] + rng.choice(_SPACES) + text[i:]
    if m == 1:  # escape a character that is written as is
        j = rng.randrange(n)
        ch = text[j]
        esc = f"\\u{ord(ch):04x}" if rng.random() < 0.5 else f"\\u{ord(ch):04X}"
        return text[:j] + esc + text[j + 1 :]
    if m == 2:  # a key given twice: repeat the first member
        body = text[1:-1]
        first = body.split(",", 1)[0]
        return "{" + first + "," + body + "}" if body else text
    if m == 3:  # members swapped (top level)
        try:
            obj = json.loads(text)
        except ValueError:
            return text
        items = list(obj.items())
        rng.shuffle(items)
        return "{" + ",".join(f"{json.dumps(k)}:{jobcomment.canonical(v)}" for k, v in items) + "}"
    if m == 4:  # numbers made non-canonical
        for old, new in ((":1", ":1.0"), (":0", ":-0"), (":1", ":01"), (":3", ":3e0"), (":6", ":6E1")):
            if old in text and rng.random() < 0.5:
                k = text.index(old)
                return text[:k] + new + text[k + len(old) :]
        return text + "1"
    if m == 5:  # delete a character
        return text[:i] + text[i + 1 :]
    if m == 6:  # insert a token
        return text[:i] + rng.choice(_TOKENS) + text[i:]
    if m == 7:  # truncate
        return text[:i]
    if m == 8:  # non-ASCII as is (ensure_ascii=False)
        try:
            return json.dumps(json.loads(text), separators=(",", ":"), sort_keys=True, ensure_ascii=False)
        except ValueError:
            return text + "é"
    if m == 9:  # nest deeply
        depth = rng.choice([30, 31, 32, 33, 40])
        return '{"a":' + "[" * (depth - 1) + "]" * (depth - 1) + "}"
    if m == 10:  # a needless short escape
        return text.replace("/", "\\/", 1) if "/" in text else text.replace('"a"', '"\\u0061"', 1)
    return text + rng.choice(["", " ", "x", "}", "\n"])


def comments(rng: random.Random, count: int) -> list[str]:
    """``count`` comments: canonical records, mutated ones, JSON in other spellings, token soup and plain text."""
    out: list[str] = []
    while len(out) < count:
        r = rng.random()
        obj = _record(rng)
        text = jobcomment.canonical(obj)
        if r < 0.3:
            out.append(text)
        elif r < 0.75:
            for _ in range(rng.randint(1, 2)):
                text = _mutate(rng, text) or "{"
            out.append(text)
        elif r < 0.85:
            out.append(json.dumps(obj, sort_keys=rng.random() < 0.5, ensure_ascii=rng.random() < 0.5))
        elif r < 0.95:
            out.append("{" + "".join(rng.choice(_TOKENS) for _ in range(rng.randint(0, 12))))
        else:
            out.append(rng.choice(["plain note", "lr=0.1 sweep", "", "see \"nuro\": docs", "x" * 9000,
                                   "{" + '"a":"' + "x" * 8200 + '"}', "{}"]))  # fmt: skip
    return [c for c in out if _encodable(c)]


def _encodable(text: str) -> bool:
    """Slurm hands the bridge bytes and Python decoded UTF-8: a lone surrogate (only from ensure_ascii=False dumps of
    a lone surrogate escape) cannot be either."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def install_script(etc: Path, name: str, text: str) -> None:
    """Write a bridge file into a running cluster's etc/ atomically, its mtime moved forward by at least 1 s:
    slurmctld reloads job_submit.lua only when the mtime (1 s resolution) is newer than the loaded copy's."""
    path = etc / name
    old_mtime = path.stat().st_mtime if path.exists() else 0.0
    tmp = etc / f".{name}.tmp"
    tmp.write_text(text)
    tmp.chmod(0o644)
    new_mtime = max(time.time(), old_mtime + 1.0)
    os.utime(tmp, (new_mtime, new_mtime))
    os.replace(tmp, path)
