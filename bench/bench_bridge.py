"""Bridge cost per submission: job_submit.lua before issue 11 (pattern reader, commit 0b1f475) vs now (the strict
canonical scanner, the preempt and b-<team> rules), same run.

Two measurements:

* ``lua``: the bridge alone under lua5.1 with a stub ``slurm`` table (tests/luabridge.py's stub), CPU time per
  ``slurm_job_submit`` call (os.clock inside one process, so neither process start nor a loaded machine's waits
  count) for the comment nuro-train writes (~450 bytes), for no comment, and for an 8 KB comment (the worst case
  the scanner reads whole). Each bridge reads the table of its own time (the old one lacks the three new rules);
  ``reader_*``: the comment reader alone (old ``read_nuro``, new ``read_comment``), without the table's dofile.
* ``sbatch``: wall time of ``sbatch --hold`` as team member alice on a fresh dev cluster, the old and the new
  job_submit.lua swapped in round by round (interleaved, so drift in slurmctld load hits both), median per
  submission. This is what a user waits for; the bridge is a small part of it.

    python -m bench.bench_bridge [--calls 3000] [--rounds 8] [--per-round 25] [--port-base 12000] [--no-cluster]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPO, cluster, save
from nuro.policy import load_policy
from nuro.policy.luatable import TABLE_FILE, _lua_value, policy_table, render_lua_table
from nuro.protocol import jobcomment
from tests.luabridge import FIND_UPVALUE, LUA, NURO, install_script, job_desc, lua_value

BASELINE_COMMIT = "0b1f475"
POLICY = REPO / "examples" / "policy" / "teams.yaml"
USER = "alice"
NEW_RULES = ("comment_not_canonical", "preempt_forged", "qos_borrow")

_TIMER = (
    r"""
local CODES = { ESLURM_ACCESS_DENIED = 2002, ESLURM_ACCOUNTING_POLICY = 2050, ESLURM_INVALID_ACCOUNT = 2045 }
slurm = { SUCCESS = 0, ERROR = -1, NO_VAL = 4294967294, NO_VAL16 = 65534, INFINITE = 4294967295 }
for k, v in pairs(CODES) do slurm[k] = v end
slurm.log_user = function() end
slurm.log_info = function() end
slurm.log_debug = function() end
slurm.log_error = function(fmt, ...) error(string.format(fmt, ...)) end
assert(dofile(arg[1]) == slurm.SUCCESS)
local job = dofile(arg[2])
local comments = dofile(arg[3])
local calls = tonumber(arg[4])
for name, c in pairs(comments) do
  local rc
  local t0 = os.clock()
  for _ = 1, calls do
    local d = {}
    for k, v in pairs(job) do d[k] = v end
    d.comment = c ~= "" and c or nil
    rc = slurm_job_submit(d, {}, 1000)
  end
  print(name .. "\t" .. ((os.clock() - t0) / calls * 1e6) .. "\t" .. rc)
end
-- the comment reader alone (old: read_nuro, new: read_comment), found among the bridge's upvalues
"""
    + FIND_UPVALUE
    + r"""
local reader = assert(find(slurm_job_submit, { read_nuro = true, read_comment = true }))
for name, c in pairs(comments) do
  local t0 = os.clock()
  for _ = 1, calls * 5 do reader(c) end
  print("reader_" .. name .. "\t" .. ((os.clock() - t0) / (calls * 5) * 1e6) .. "\t0")
end
"""
)


def _old_bridge() -> str:
    return subprocess.run(
        ["git", "show", f"{BASELINE_COMMIT}:slurm_plugins/job_submit.lua"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip


def _tables() -> tuple[str, str]:
    """(old, new) policy tables: the new one as rendered now, the old one without the rules issue 11 added."""
    policy = load_policy(POLICY)
    table = policy_table(policy)
    old = {**table, "rules": {k: v for k, v in table["rules"].items() if k not in NEW_RULES}}
    return "return " + _lua_value(old, 0) + "\n", render_lua_table(policy)


def _comments() -> dict[str, str]:
    typical = jobcomment.merge(jobcomment.merge(None, nuro=NURO), ckpt={"at": 1700000000, "step": 100})
    big = jobcomment.merge(typical, user_comment="x" * (8192 - len(typical) - 20))
    return {"typical": typical, "none": "", "max_8k": big}


def lua_cost(calls: int, repeats: int = 7) -> dict:
    """µs of CPU per slurm_job_submit, old vs new bridge, per comment kind: the minimum over ``repeats`` interleaved
    runs (the least disturbed by other load on the machine), the median beside it."""
    if LUA is None:
        raise SystemExit("lua5.1 is not installed (apt-get install lua5.1)")
    old_table, new_table = _tables()
    comments = _comments()
    samples: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="nuro-bench-lua-") as tmp:
        for label, bridge, table in (("old", _old_bridge(), old_table), ("new", None, new_table)):
            d = Path(tmp) / label
            d.mkdir()
            (d / "job_submit.lua").write_text(bridge or (REPO / "slurm_plugins/job_submit.lua").read_text())
            (d / TABLE_FILE).write_text(table)
            (d / "job.lua").write_text("return " + lua_value(job_desc(USER)) + "\n")
            (d / "comments.lua").write_text("return " + lua_value(comments) + "\n")
            (d / "timer.lua").write_text(_TIMER)
        for _ in range(repeats):
            for label in ("old", "new"):
                d = Path(tmp) / label
                argv = [LUA, str(d / "timer.lua"), str(d / "job_submit.lua"), str(d / "job.lua"),
                        str(d / "comments.lua"), str(calls)]  # fmt: skip
                res = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=600)
                for line in res.stdout.splitlines():
                    name, us, rc = line.split("\t")
                    assert rc == "0", f"{label} bridge refused the {name} comment: rc {rc}"
                    samples.setdefault((name, label), []).append(float(us))
    out: dict = {"calls": calls, "repeats": repeats, "comment_bytes": {k: len(v) for k, v in comments.items()}}
    for name in [*comments, *(f"reader_{c}" for c in comments)]:
        old, new = samples[(name, "old")], samples[(name, "new")]
        out[name] = {
            "old_us": round(min(old), 1), "new_us": round(min(new), 1), "ratio": round(min(new) / min(old), 3),
            "old_median_us": round(statistics.median(old), 1), "new_median_us": round(statistics.median(new), 1),
        }  # fmt: skip
    return out


def sbatch_cost(rounds: int, per_round: int, port_base: int) -> dict:
    """Median wall seconds per held sbatch as alice, old vs new job_submit.lua, interleaved."""
    comment = _comments()["typical"]
    old_table, new_table = _tables()
    scripts = {
        "old": (_old_bridge(), old_table),
        "new": ((REPO / "slurm_plugins/job_submit.lua").read_text(), new_table),
    }
    times: dict[str, list[float]] = {"old": [], "new": []}
    with cluster(8, port_base, "bridge") as (layout, env, _):
        full_env = {**os.environ, **env}
        subprocess.run([str(Path(sys.executable).parent / "nuro-admin"), "policy", "apply", str(POLICY)],
                       env=full_env, check=True, capture_output=True)  # fmt: skip
        etc = Path(env["SLURM_CONF"]).parent
        argv = ["runuser", "-u", USER, "--", "env", *(f"{k}={v}" for k, v in env.items()), "sbatch", "--parsable",
                "--hold", "-J", "bench-bridge", "-D", "/tmp", "-o", "/dev/null", "--gpus-per-node=1",
                f"--comment={comment}", "--wrap", "true"]  # fmt: skip
        for r in range(rounds):
            for label in ("old", "new") if r % 2 == 0 else ("new", "old"):
                script, table = scripts[label]
                install_script(etc, "job_submit.lua", script)
                install_script(etc, TABLE_FILE, table)
                subprocess.run(argv, env=full_env, capture_output=True, check=True)  # reload outside the timing
                for _ in range(per_round):
                    t0 = time.perf_counter()
                    subprocess.run(argv, env=full_env, capture_output=True, check=True)
                    times[label].append(time.perf_counter() - t0)
            subprocess.run(["scancel", "--name=bench-bridge"], env=full_env, capture_output=True)
        log = (layout.log / "slurmctld.log").read_text(errors="replace")
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "submissions_each": len(times["new"]),
        "old_median_s": round(med["old"], 4),
        "new_median_s": round(med["new"], 4),
        "ratio": round(med["new"] / med["old"], 3),
        "new_bridge_errors": log.count("internal error, job passes unchanged"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--per-round", type=int, default=25)
    ap.add_argument("--port-base", type=int, default=12000)
    ap.add_argument("--no-cluster", action="store_true", help="only the lua5.1 measurement")
    args = ap.parse_args()
    result = {"baseline": BASELINE_COMMIT, "lua": lua_cost(args.calls)}
    if not args.no_cluster:
        result["sbatch"] = sbatch_cost(args.rounds, args.per_round, args.port_base)
    save("bridge", result)
    print(json.dumps(result, indent=2), file=sys.stderr)


if __name__ == "__main__":
    main()
