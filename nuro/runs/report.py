"""What a run logged, what it stored, and how two runs differ: the views of ``nuro-train metrics | artifacts |
compare``, also read by the dev wing's scenarios and the demo.

Every view is assembled from the systems of record (architecture principle 1), never from a nuro database:

| view | Slurm (comment, accounting) | metrics sink | S3 |
|---|---|---|---|
| ``metrics JOB`` | team/run, its nodes, whether it ended | ``train`` rows of the job, ``gpu`` rows of its GPUs | — |
| ``artifacts JOB`` | team/run of the job | — | checkpoint manifests and step prefixes, run events |
| ``compare A B`` | script, args, tier, nodes, GPUs, dataset, code | final loss, throughput, steps | checkpoints |

A job id names the run, as in ``nuro-train status/events``. The sink is ``NURO_METRICS_URL``'s (default: the
embedded SQLite file, see docs/metrics.md); S3 is ``NURO_S3_*``'s. The pure parts (``summarize``, ``gpu_latest``,
``plot_series``, ``compare_rows``, the renderers) take rows and dicts, so they are tested without any server; the
readers (``resolve_run``, ``read_rows``, ``gather_artifacts``, ``count_checkpoints``) raise, and the CLI turns their
errors into exit codes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from nuro.checkpoint import layout as L
from nuro.lifecycle.run_events import decode, read_event, run_prefix, skipped_steps
from nuro.metrics.identities import platform_view
from nuro.metrics.model import GPU, TRAIN, Query, Row
from nuro.metrics.sink import sink_from_env
from nuro.objectstore import ObjectStore, ObjectStoreError
from nuro.protocol import jobcomment
from nuro.protocol.envnames import NURO_TEAM
from nuro.runs.checkpoints import find_job, run_checkpoints
from nuro.slurm import CliBackend, JobInfo

#: ``gpu`` rows older than this are not "now" (the agent writes at 1 Hz; a node without telemetry shows none).
GPU_RECENT_S = 30.0
DEFAULT_HISTORY = 10_000


# -- the run, from Slurm -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunRef:
    """A job and the run it belongs to. ``team``/``run`` are None for a job without a nuro record."""

    job_id: int
    team: str | None
    run: str | None
    meta: Mapping[str, Any]
    job: JobInfo

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.job.nodes

    @property
    def finished(self) -> bool:
        return self.job.is_finished


def no_run_note(job_id: int, meta: Mapping[str, Any]) -> str:
    """Why a job has no run to look up in S3, in the words every command uses: no nuro record at all, or a record
    that names no run (nuro-sbatch records the team and the pins; the script's own ``NURO_RUN_NAME`` never reaches
    Slurm), so ``status`` showing a record and ``events`` finding no run never contradict each other."""
    if not meta:
        return f"job {job_id} carries no nuro run record"
    via = f" (written by {meta['via']}, which records no run name)" if meta.get("via") else ""
    return f"job {job_id}'s nuro run record names no run{via}"


def _meta(comment: str) -> dict:
    return jobcomment.parse(comment).record


def resolve_run(backend: CliBackend, job_id: int) -> RunRef:
    """The job (slurmctld, else accounting) and its run from the ``nuro`` comment record (any attempt's).

    Raises LookupError (no such job) and SlurmError.
    """
    job = find_job(backend, job_id)
    meta = _meta(job.comment)
    if not meta:  # squeue can lose the comment of a finished job; accounting keeps one per attempt
        for attempt in reversed(backend.attempts(job_id)):
            meta = _meta(attempt.comment)
            if meta:
                break
    team, run = meta.get("team"), meta.get("name")
    return RunRef(job_id, str(team) if team else None, str(run) if run else None, meta, job)


# -- reading the sink --------------------------------------------------------------------------------------------
def train_query(ref: RunRef, limit: int | None = DEFAULT_HISTORY) -> Query:
    """The job's ``train`` rows (every rank and restart), newest ``limit``."""
    where = {"job": str(ref.job_id)}
    if ref.team and ref.run:
        where |= {"team": ref.team, "run": ref.run}
    return Query(TRAIN, where=where, limit=limit)


def read_rows(sink: Any, ref: RunRef, now_ns: int, limit: int | None = DEFAULT_HISTORY) -> tuple[list[Row], list[Row]]:
    """``(train rows, recent gpu rows)``; raises the sink's SinkError.

    The GPUs are the job's own (points the agents tagged with it, ``nuro.protocol.gpujobs``); when there are none
    (an older agent, a node without the prolog's claims, or a job that ended more than ``GPU_RECENT_S`` ago), every
    GPU of the job's nodes, which on a shared node includes other jobs' GPUs; ``summarize`` says which.
    """
    train = sink.query(train_query(ref, limit))
    since = now_ns - int(GPU_RECENT_S * 1e9)
    gpu_sink: Any = platform_view(sink)  # a team's database has no gpu points: the agents write the platform's
    try:
        gpus: list[Row] = gpu_sink.query(Query(GPU, where={"job": str(ref.job_id)}, since_ns=since))
        if not gpus:
            for node in ref.nodes:
                gpus += gpu_sink.query(Query(GPU, where={"node": node}, since_ns=since))
    finally:
        if gpu_sink is not sink:
            gpu_sink.close()
    return train, gpus


def open_sink(team: str | None = None) -> Any:
    """The sink of ``NURO_METRICS_URL``; a member without a token reads ``team``'s database with that team's
    credential (``NURO_METRICS_CREDENTIALS``): the run's team, so another team's run is refused, not read empty.

    Raises the sink's SinkError and MetricsConfigError.
    """
    env = {**os.environ, NURO_TEAM: team} if team else None
    return sink_from_env(env)


# -- pure views --------------------------------------------------------------------------------------------------
def _rank(row: Row) -> int:
    return row.tag_index("rank", -1) if "rank" in row.tags else 0


def history(rows: Iterable[Row]) -> list[dict]:
    """Every ``train`` row flat (``ts_ns``, ``rank``, ``restart`` + its fields), oldest first, for ``--json``."""
    return [
        {"ts_ns": r.ts_ns, "rank": _rank(r), "restart": int(r.tags.get("restart", "0") or 0), **dict(r.fields)}
        for r in sorted(rows, key=lambda r: (r.ts_ns, _rank(r)))
    ]


def latest_per_rank(rows: Iterable[Row]) -> list[dict]:
    """Per rank, the newest value of each field (a field missing from the newest row keeps its last value, e.g. the
    first point after a restart has no step time), plus ``restart`` and ``ts_ns`` of the newest row. By rank."""
    latest: dict[int, dict] = {}
    for r in sorted(rows, key=lambda r: r.ts_ns):
        entry = latest.setdefault(_rank(r), {"rank": _rank(r)})
        entry.update(r.fields)
        entry["restart"] = int(r.tags.get("restart", "0") or 0)
        entry["ts_ns"] = r.ts_ns
    return [latest[k] for k in sorted(latest)]


def gpu_latest(rows: Iterable[Row]) -> list[dict]:
    """The newest ``gpu`` row per (node, gpu), sorted by node and index."""
    latest: dict[tuple[str, int], dict] = {}
    for r in sorted(rows, key=lambda r: r.ts_ns):
        idx = r.tag_index("gpu", -1)
        latest[(r.tags.get("node", "?"), idx)] = {
            "node": r.tags.get("node", "?"), "gpu": idx, "model": r.tags.get("model", ""), "ts_ns": r.ts_ns,
            **dict(r.fields),
        }  # fmt: skip
    return [latest[k] for k in sorted(latest)]


def summarize(ref: RunRef, train: Sequence[Row], gpus: Sequence[Row], notes: Sequence[str] = ()) -> dict:
    """The ``metrics`` view as one JSON-able dict (what ``--json`` prints and the table shows)."""
    return {
        "job_id": ref.job_id,
        "team": ref.team,
        "run": ref.run,
        "state": ref.job.state,
        "finished": ref.finished,
        "nodes": list(ref.nodes),
        "ranks": latest_per_rank(train),
        "gpus": gpu_latest(gpus),
        # "job": exactly the job's GPUs; "nodes": every GPU of its nodes (no claims seen, see read_rows)
        "gpus_of": "job" if gpus and all(r.tags.get("job") == str(ref.job_id) for r in gpus) else "nodes",
        "history": history(train),
        "notes": list(notes),
    }


def plot_series(train: Iterable[Row]) -> dict[str, list]:
    """Loss (lowest rank) and job throughput (samples/s summed over the ranks that reported the step) per step.

    When a step was logged by several restarts (it was done again after a resume), the newest value wins.
    """
    by_step_loss: dict[int, float] = {}
    by_step_tput: dict[int, dict[int, float]] = {}
    rows = sorted(train, key=lambda r: r.ts_ns)
    low = min((_rank(r) for r in rows), default=0)
    for r in rows:
        step = r.fields.get("step")
        if not isinstance(step, int | float):
            continue
        step = int(step)
        if _rank(r) == low and isinstance(r.fields.get("loss"), int | float):
            by_step_loss[step] = float(r.fields["loss"])
        if isinstance(r.fields.get("samples_per_s"), int | float):
            by_step_tput.setdefault(step, {})[_rank(r)] = float(r.fields["samples_per_s"])
    loss_steps = sorted(by_step_loss)
    tput_steps = sorted(by_step_tput)
    return {
        "loss_steps": loss_steps,
        "loss": [by_step_loss[s] for s in loss_steps],
        "throughput_steps": tput_steps,
        "samples_per_s": [sum(by_step_tput[s].values()) for s in tput_steps],
    }


def _num(v: Any, fmt: str) -> str:
    return format(v, fmt) if isinstance(v, int | float) and not isinstance(v, bool) else "—"


def _seconds(v: Any) -> str:
    return _num(v, ".3f") + (" s" if isinstance(v, int | float) and not isinstance(v, bool) else "")


def render_metrics(summary: Mapping[str, Any]) -> Group:
    """Rich tables: latest values per rank, then GPU utilisation of the job's nodes."""
    title = (f"job {summary['job_id']} {summary['team'] or '-'}/{summary['run'] or '-'} ({summary['state']}): "
             "latest per rank")  # fmt: skip
    ranks = Table(title=title, title_justify="left")
    for col in ("rank", "restart", "step", "loss", "samples/s", "step time", "data wait"):
        ranks.add_column(col, justify="right")
    for r in summary["ranks"]:
        ranks.add_row(
            str(r["rank"]), str(r.get("restart", 0)), _num(r.get("step"), "d"), _num(r.get("loss"), ".4f"),
            _num(r.get("samples_per_s"), ".1f"), _seconds(r.get("step_time_s")), _seconds(r.get("data_wait_s")),
        )  # fmt: skip
    ended = summary.get("finished", False)
    none = f"job {summary['job_id']} ({summary['state']}) recorded no training metrics" if ended else (
        f"job {summary['job_id']}: no training metrics yet")  # fmt: skip
    parts: list[Any] = [ranks if summary["ranks"] else Text(none)]
    if summary["gpus"]:
        whose = (f"job {summary['job_id']}" if summary.get("gpus_of") == "job"
                 else f"nodes {', '.join(summary['nodes'])}")  # fmt: skip
        gpus = Table(title=f"GPUs of {whose} (last {GPU_RECENT_S:.0f} s)", title_justify="left")
        for col in ("node", "gpu", "util", "memory", "temp", "SM clock", "power"):
            gpus.add_column(col, justify="left" if col == "node" else "right")
        for g in summary["gpus"]:
            mem = (f"{g['mem_used_bytes'] / 2**30:.1f} / {g['mem_total_bytes'] / 2**30:.0f} GiB"
                   if "mem_used_bytes" in g and "mem_total_bytes" in g else "—")  # fmt: skip
            gpus.add_row(
                g["node"], str(g["gpu"]), _num(g.get("util_pct"), ".0f") + " %", mem,
                _num(g.get("temp_c"), ".0f") + " °C", _num(g.get("sm_clock_mhz"), ".0f") + " MHz",
                _num(g.get("power_w"), ".0f") + " W",
            )  # fmt: skip
        parts.append(gpus)
    elif summary["nodes"] and not ended:  # an ended job's nodes are someone else's now
        parts.append(Text(f"no GPU telemetry from {', '.join(summary['nodes'])} in the last {GPU_RECENT_S:.0f} s"))
    return Group(*parts)


def plot_text(series: Mapping[str, list], width: int = 100, height: int = 30) -> str:
    """Loss and throughput over steps as plain terminal text, two panels one above the other.

    Written for plotext 6 (``plotext.figure`` with ``signal``/``draw``/``build``; the 5.x ``plt.plot`` API is gone)
    and rendered colourless, so the text is the same in a terminal, a pipe and a test.
    """
    import plotext  # lazy: plotext costs ~0.5 s at import, and only --plot draws

    fig = plotext.figure
    fig.clear()
    fig.plot_size(width, height)
    fig.subplots(2, 1)
    for row, (title, xs, ys) in enumerate(
        (("loss (lowest rank)", series["loss_steps"], series["loss"]),
         ("samples/s (all ranks) over steps", series["throughput_steps"], series["samples_per_s"])), start=1,
    ):  # fmt: skip
        panel = fig.subplot(row, 1)
        panel.title(title)
        if xs:
            panel.draw(panel.signal(list(xs), list(ys), marker="braille").lines())
    text = fig.build().string(colorless=True)
    fig.clear()
    return text


def gather_artifacts(ref: RunRef, store: Any) -> dict:
    """Checkpoints (committed and not) and the other objects under the run's prefixes. Raises ObjectStoreError."""
    if not ref.team or not ref.run:
        return {"job_id": ref.job_id, "team": None, "run": None, "checkpoints": [], "uncommitted": [], "objects": [],
                "notes": [f"{no_run_note(ref.job_id, ref.meta)}: it has no run prefixes in S3"]}  # fmt: skip
    objects = []
    sizes: dict[str, int] = {}  # the checkpoints' own files, for the manifests' size check
    skip_events: list[str] = []
    ckpt_root = L.run_prefix(ref.team, ref.run)
    for prefix in (ckpt_root, run_prefix(ref.team, ref.run)):
        for o in store.list(prefix):
            rest = o.key[len(ckpt_root) :] if o.key.startswith(ckpt_root) else ""
            if rest and L.parse_step_name(rest.split("/", 1)[0]) is not None:
                sizes[o.key] = o.size
                continue  # a checkpoint's own files: shown as the checkpoint
            if o.key.endswith("-checkpoint_skipped.json"):
                skip_events.append(o.key)
            objects.append({"key": o.key, "bytes": o.size,
                            "modified": o.last_modified.isoformat() if o.last_modified else None,
                            "kind": artifact_kind(o.key)})  # fmt: skip
    committed, other = run_checkpoints(store, ref.team, ref.run, sizes)
    skipped: dict[int, list[dict]] = {}
    for key in skip_events:  # few: one per restore that passed over a step
        data = read_event(store, key)
        event = decode(data) if data is not None else None
        for s in skipped_steps(event) if event is not None else ():
            skipped.setdefault(s["step"], []).append({"job_id": event.job_id, "reason": s["reason"]})  # type: ignore[union-attr]
    for c in committed:
        c["skipped_by"] = skipped.get(c["step"], [])
    return {"job_id": ref.job_id, "team": ref.team, "run": ref.run, "checkpoints": committed, "uncommitted": other,
            "objects": objects, "notes": []}  # fmt: skip


def artifact_kind(key: str) -> str:
    """What an object under a run prefix is, from its key: ``run event <kind>``, ``checkpoint tag`` or ``other``."""
    if "/events/" in key and key.endswith(".json"):
        return "run event " + key.rsplit("-", 1)[-1].removesuffix(".json")
    if "/tags/" in key:
        return "checkpoint tag"
    return "other"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def checkpoint_status(c: Mapping[str, Any]) -> str:
    """``committed``, or what makes a committed step unusable: files torn since (missing or resized in S3), or a
    restore that passed over it (``checkpoint_skipped`` run events: the job and the reason)."""
    bits = []
    if c.get("damaged"):
        bits.append("torn: " + ", ".join(c["damaged"][:3]) + (" …" if len(c["damaged"]) > 3 else ""))
    for s in c.get("skipped_by") or ():
        bits.append(f"skipped at restore by job {s['job_id']}: {s['reason']}")
    return "; ".join(bits) or "committed"


def render_artifacts(a: Mapping[str, Any]) -> Group:
    """Checkpoints table, uncommitted steps, then other objects grouped by kind (run events can be many)."""
    parts: list[Any] = []
    t = Table(title=f"job {a['job_id']} {a['team'] or '-'}/{a['run'] or '-'}: checkpoints", title_justify="left")
    for col in ("step", "size", "committed at", "job", "restart", "parent", "status"):
        t.add_column(col, justify="right" if col in ("step", "size", "restart", "parent") else "left")
    for c in a["checkpoints"]:
        style = "bold" if str(c["job_id"]) == str(a["job_id"]) else None
        status = checkpoint_status(c)
        t.add_row(str(c["step"]), _size(c["bytes"]), c["committed_at"], str(c["job_id"]), str(c["restart"]),
                  "—" if c["parent"] is None else str(c["parent"]), status,
                  style="yellow" if status != "committed" else style)  # fmt: skip
    parts.append(t if a["checkpoints"] else Text("no committed checkpoints"))
    for u in a["uncommitted"]:
        parts.append(Text(f"step {u['step']}: not committed ({u['status']}), {_size(u['bytes'])} stored"))
    kinds: dict[str, list[dict]] = {}
    for o in a["objects"]:
        kinds.setdefault(o["kind"], []).append(o)
    if kinds:
        o_t = Table(title="other objects under the run's prefixes", title_justify="left")
        for col in ("kind", "objects", "size", "newest"):
            o_t.add_column(col)
        for kind, objs in sorted(kinds.items()):
            newest = max((o["modified"] or "" for o in objs), default="")
            o_t.add_row(kind, str(len(objs)), _size(sum(o["bytes"] for o in objs)), newest or "—")
        parts.append(o_t)
    parts += [Text(f"note: {n}", style="yellow") for n in a["notes"]]
    return Group(*parts)


# -- compare ------------------------------------------------------------------------------------------------------
def final_metrics(train: Sequence[Row]) -> dict:
    """Last loss (lowest rank), mean job throughput (sum over ranks of each rank's mean samples/s), last step."""
    ranks: dict[int, list[float]] = {}
    for r in train:
        if isinstance(r.fields.get("samples_per_s"), int | float):
            ranks.setdefault(_rank(r), []).append(float(r.fields["samples_per_s"]))
    latest = latest_per_rank(train)
    low = latest[0] if latest else {}
    steps = [int(r.fields["step"]) for r in train if isinstance(r.fields.get("step"), int | float)]
    return {
        "last_loss": low.get("loss"),
        "mean_samples_per_s": round(sum(sum(v) / len(v) for v in ranks.values()), 3) if ranks else None,
        "last_step": max(steps) if steps else None,
        "ranks": len(latest),
    }


def run_summary(ref: RunRef, train: Sequence[Row], checkpoints: int | None) -> dict:
    """What ``compare`` puts side by side for one run: parameters, pins, final metrics, checkpoints."""
    m = ref.meta
    entry = m.get("entry") if isinstance(m.get("entry"), dict) else {}
    ds = m.get("dataset") if isinstance(m.get("dataset"), dict) else {}
    code = m.get("code") if isinstance(m.get("code"), dict) else {}
    return {
        "job_id": ref.job_id,
        "run": {"team": ref.team, "name": ref.run, "state": ref.job.state, "restarts": ref.job.restart_count},
        "params": {
            "script": entry.get("script"), "args": " ".join(map(str, entry.get("args") or [])) or None,
            "launcher": entry.get("launcher"), "tier": m.get("tier"), "nodes": ref.job.node_count,
            "gpus": ref.job.gpus_total,
        },
        "data": {"dataset": ds.get("name"), "digest": ds.get("digest")},
        "code": {"repo": code.get("repo"), "commit": code.get("commit"), "diff": code.get("diff")},
        "metrics": final_metrics(train),
        "checkpoints": {"committed": checkpoints},
    }  # fmt: skip


def count_checkpoints(ref: RunRef, store: Callable[[], ObjectStore]) -> tuple[int | None, str | None]:
    """``(how many committed checkpoints ref's job wrote, None)``, or ``(None, a note saying why not)``.

    ``store`` opens the object store on first need (a run without a record has no prefixes to list, so it opens
    none); a store that cannot be read is a note, not a failure: ``compare`` still shows everything else.
    """
    if not ref.team or not ref.run:
        return None, None
    try:
        committed, _ = run_checkpoints(store(), ref.team, ref.run)
    except (ObjectStoreError, ValueError) as exc:
        return None, f"checkpoints of job {ref.job_id} not counted: {exc}"
    return sum(1 for c in committed if str(c["job_id"]) == str(ref.job_id)), None


#: Sections whose values describe how the run was set up (a difference there explains one in "metrics").
INPUT_SECTIONS = ("params", "data", "code")


def compare_rows(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[dict]:
    """Flatten two ``run_summary`` dicts into ``{section, key, a, b, same}`` rows, in a fixed order. Pure."""
    rows = []
    for section in ("run", "params", "data", "code", "metrics", "checkpoints"):
        sa, sb = a.get(section) or {}, b.get(section) or {}
        for key in list(dict.fromkeys([*sa, *sb])):
            va, vb = sa.get(key), sb.get(key)
            rows.append({"section": section, "key": key, "a": va, "b": vb, "same": va == vb})
    return rows


def _cell(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def render_compare(a: Mapping[str, Any], b: Mapping[str, Any], rows: Sequence[dict]) -> Table:
    """Side by side; differing inputs in bold yellow, differing results in yellow, identical rows dim."""
    t = Table(title=f"job {a['job_id']} vs job {b['job_id']}", title_justify="left")
    t.add_column("")
    t.add_column("")
    t.add_column(f"job {a['job_id']}", overflow="fold")  # digests and commits are what people compare: never cut
    t.add_column(f"job {b['job_id']}", overflow="fold")
    t.add_column("")
    for r in rows:
        style = "dim" if r["same"] else ("bold yellow" if r["section"] in INPUT_SECTIONS else "yellow")
        t.add_row(r["section"], r["key"], _cell(r["a"]), _cell(r["b"]), "" if r["same"] else "≠", style=style)
    return t


__all__ = [
    "DEFAULT_HISTORY", "GPU_RECENT_S", "INPUT_SECTIONS", "RunRef", "artifact_kind", "compare_rows", "no_run_note",
    "count_checkpoints", "final_metrics", "gather_artifacts", "gpu_latest", "history", "latest_per_rank",
    "open_sink", "plot_series", "plot_text", "read_rows", "render_artifacts", "render_compare", "render_metrics",
    "resolve_run", "run_summary", "summarize", "train_query",
]  # fmt: skip
