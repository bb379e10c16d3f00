"""The shards a run reads first, fetched into the node's shard cache while the job starts (the prolog's prefetch).

Why it works without knowing the world size or the batch size: every rank reads the same global order
(``nuro.datasets.order``), round-robin from one position, and that order is a block shuffle: the epoch begins with
the samples of one window of shards, shuffled together. So the first shards any rank of the job reads are the first
shards of the epoch-0 order, the same on every node: ``first_shards`` (pure) lists them in first-use order, from the
snapshot's own sample index and the run's data seed (``nuro-train submit --data-seed``, recorded with the run; the
loader's default is the same ``NURO_DATA_SEED``). A run whose code passes another seed or ``samples=`` gets the wrong
shards warmed: a wasted fetch, never a wrong read (every read is verified against the manifest).

Who fetches (``main``, ``python -m nuro.datasets.prefetch``): the prolog starts this as the job's own user, with the
job's groups and the team's S3 credentials (``NURO_S3_CREDENTIALS``), in its own session, and returns at once: the
fetch overlaps the job's start-up (checkout, torch import, rendezvous, model build) instead of delaying it. As the
job's user it writes the team's cache dir exactly as the job's loader would (``nuro.datasets.cache``: one GET per
shard per node, verified on arrival; a loader asking for a shard being fetched waits for that one copy), so root
never writes into a directory a team member can change, and no key but the team's is in a process the user owns.
It stops after ``--timeout-s`` whatever it has done, and writes what it did to ``--report`` (the job's staging
dir) for the job and the start-up bench to read.

It ends with the job (``nuro.prolog_epilog.prefetchguard`` has the design): the prolog runs before the job's cgroups
exist, so the prefetch joins them itself (``--cgroup``: the job's cgroup v1 dirs; it moves itself into the job's
first step cgroup as soon as one appears, and is then limited, accounted and killed with the job like its tasks),
and the epilog kills it by the pid the prolog recorded as root, should it still run when the job ends. A first
attempt only: a requeued run continues from a position inside its checkpoint, which root does not unpickle.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from nuro.datasets.manifest import Manifest
from nuro.datasets.order import DEFAULT_WINDOW, epoch_order

#: Shards prefetched by default: one shuffle window, which is what every rank reads from first.
DEFAULT_SHARDS = DEFAULT_WINDOW
#: How long the prefetch may run by default (it is also killed with the job's session).
DEFAULT_TIMEOUT_S = 120.0
#: The prefetch's nice value: below the job's processes, so on a busy node it never slows the job's own start-up
#: (measured on 2 shared cores without it: torch's import took 0.9 s longer while the prefetch hashed and received).
NICE = 10
#: Largest data seed accepted (the run record's bound: a 31-bit integer).
MAX_SEED = 2**31 - 1


def first_shards(manifest: Manifest, seed: int, count: int, window: int = DEFAULT_WINDOW) -> list[str]:
    """The digests of the first ``count`` distinct shards the epoch-0 order reads, in first-use order (every shard
    of a sample's files, not only the one it is grouped by)."""
    if count < 1:
        return []
    samples, groups = manifest.sample_shards()
    shard_of = {f.path: f.shard for f in manifest.files}
    seen: dict[str, None] = {}
    for index in epoch_order(groups, seed, 0, window):
        for path in samples[index]:
            seen.setdefault(shard_of[path], None)
            if len(seen) >= count:
                return list(seen)
    return list(seen)


def prefetch_command(
    python: str, name: str, digest: str, team: str, seed: int, shards: int, timeout_s: float, report: Path,
    cgroups: Sequence[str] = (),
) -> list[str]:  # fmt: skip
    """The prefetch's command line (rendered as data; the prolog runs it as the job's user, no shell)."""
    return [
        python, "-m", "nuro.datasets.prefetch", "--name", name, "--digest", digest, "--team", team,
        "--seed", str(seed), "--shards", str(shards), "--timeout-s", f"{timeout_s:g}", "--report", str(report),
        *(a for c in cgroups for a in ("--cgroup", c)),
    ]  # fmt: skip


#: The job's step cgroups, in the order the prefetch prefers to join one (the batch step lives as long as the job)
STEP_CGROUPS = ("step_batch", "step_extern", "step_0")


def join_job_cgroups(job_dirs: Sequence[str], until: float, poll_s: float = 0.1, pid: int | None = None) -> list[str]:
    """Move this process into the first step cgroup of the job under each of ``job_dirs`` (cgroup v1: one per
    controller) as soon as one exists, waiting until ``until`` (monotonic); returns the ``cgroup.procs`` files it
    joined. Slurm makes step dirs the job user's own (the job dir stays root's), so the job's user may join them;
    a dir that never appears or refuses us is left out (the epilog's kill still bounds the process)."""
    pid = os.getpid() if pid is None else pid
    todo, joined = list(job_dirs), []
    while todo:
        for job_dir in list(todo):
            for step in STEP_CGROUPS:
                procs = Path(job_dir) / step / "cgroup.procs"
                if not procs.exists():
                    continue
                try:
                    procs.write_text(f"{pid}\n")
                    joined.append(str(procs))
                except OSError as exc:
                    print(f"nuro prefetch: cannot join {procs}: {exc}", file=sys.stderr)
                todo.remove(job_dir)
                break
        if not todo or time.monotonic() >= until:
            break
        time.sleep(poll_s)
    return joined


def main(argv: Sequence[str] | None = None) -> int:
    """Fetch the first shards of a pinned snapshot into ``$NURO_DATA_CACHE_DIR/<team>`` (module docstring)."""
    ap = argparse.ArgumentParser(prog="python -m nuro.datasets.prefetch", description=__doc__.splitlines()[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--digest", required=True)
    ap.add_argument("--team", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shards", type=int, default=DEFAULT_SHARDS)
    ap.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S)
    ap.add_argument("--report", type=Path, required=True)
    ap.add_argument("--cgroup", action="append", default=[], help="a job cgroup dir to join (repeatable)")
    args = ap.parse_args(argv)
    signal.alarm(max(1, int(args.timeout_s)))  # bounded whatever S3 does: SIGALRM ends the process
    os.nice(NICE)  # the job's own start-up (imports, rendezvous) goes first; the fetch takes the CPU it leaves idle
    started = time.monotonic()
    report: dict[str, object] = {"dataset": f"{args.name}@{args.digest}", "seed": args.seed, "shards": []}
    if args.cgroup:  # beside the fetch: the job's step cgroups appear only once the prolog has returned
        joiner = threading.Thread(target=lambda: report.update(cgroups=join_job_cgroups(
            args.cgroup, started + args.timeout_s)), name="nuro-prefetch-cgroup", daemon=True)  # fmt: skip
        joiner.start()
    try:
        report.update(_fetch(args, report))
    except Exception as exc:  # an optimisation: the job's loader fetches what is missing itself
        report["error"] = f"{type(exc).__name__}: {exc}"[:500]
    report["seconds"] = round(time.monotonic() - started, 3)
    _write_report(args.report, report)
    return 0 if "error" not in report else 1


def _fetch(args: argparse.Namespace, report: dict[str, object]) -> dict[str, object]:
    # lazy: the pure part above is imported by the prolog and the unit tests without boto3
    from nuro.datasets.cache import cache_from_env
    from nuro.datasets.manifest import shard_key
    from nuro.datasets.refs import load_manifest
    from nuro.objectstore import ObjectStore

    if not 0 <= args.seed <= MAX_SEED:
        raise ValueError(f"seed {args.seed} is outside 0..{MAX_SEED}")
    cache = cache_from_env(args.team)
    if cache is None:
        raise ValueError("NURO_DATA_CACHE_DIR is not set: there is no node cache to prefetch into")
    store = ObjectStore.from_env(connect_timeout_s=5.0, read_timeout_s=20.0, max_attempts=3)
    manifest = load_manifest(store, args.name, args.digest)[0]
    sizes = {s.digest: s.size for s in manifest.shards}
    done: list[str] = report["shards"]  # type: ignore[assignment]
    for digest in first_shards(manifest, args.seed, args.shards):
        cache.open(digest, sizes[digest], lambda d=digest: store.iter_chunks(shard_key(d, args.name))).close()
        done.append(digest)
    return {"cache": cache.stats.to_dict()}


def _write_report(path: Path, report: dict[str, object]) -> None:
    """What was prefetched, as JSON next to the job's staging files (atomic: written aside, then renamed)."""
    try:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(report, sort_keys=True) + "\n")
        tmp.replace(path)
    except OSError as exc:
        print(f"nuro prefetch: report not written to {path}: {exc}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
