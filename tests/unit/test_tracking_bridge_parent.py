"""The MLflow bridge links a resumed run to its parent only inside the run's own team (issue 30).

``resume_from`` is text the job's owner writes (``scontrol update comment=...`` or a hand-made record), so a member
of one team can name any job id as the parent, another team's among them. The bridge must then link nothing: the
child never hangs under the other team's run and never carries that run's id. The fake client keeps runs per
experiment like MLflow does (a search only sees the experiments it names).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from nuro.devcluster import scenario
from nuro.jobspec.record import comment_json
from nuro.slurm import JobInfo
from nuro.tracking import mirror
from nuro.tracking.bridge import Bridge


class FakeMlflow:
    def __init__(self) -> None:
        self.experiments: dict[str, str] = {}
        self.runs: dict[str, dict[str, Any]] = {}

    def experiment_id(self, name: str, *, create: bool = True, tags: Any = None) -> str:
        return self.experiments.setdefault(name, str(len(self.experiments) + 1))

    def create_run(self, experiment_id: str, name: str, *, start_ms: Any = None, tags: Any = None) -> str:
        run_id = f"run{len(self.runs) + 1}"
        self.runs[run_id] = {"info": {"run_id": run_id, "experiment_id": experiment_id, "status": ""},
                             "data": {"tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]}}  # fmt: skip
        return run_id

    def find_run(self, experiment_id: str, tag: str, value: str) -> dict[str, Any] | None:
        for run in self.runs.values():
            tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
            if run["info"]["experiment_id"] == experiment_id and tags.get(tag) == value:
                return run
        return None

    def tags(self, run_id: str) -> dict[str, str]:
        return {t["key"]: t["value"] for t in self.runs[run_id]["data"]["tags"]}

    def log_batch(self, run_id: str, metrics: Any = (), params: Any = None, tags: Any = None) -> None:
        for k, v in (tags or {}).items():
            self.runs[run_id]["data"]["tags"].append({"key": k, "value": v})

    def log_dataset(self, *a: Any, **k: Any) -> None: ...
    def update_run(self, *a: Any, **k: Any) -> None: ...
    def delete_tag(self, *a: Any, **k: Any) -> None: ...
    def put_artifact(self, *a: Any, **k: Any) -> None: ...


def _job(job_id: int, team: str, resume_from: int | None = None) -> JobInfo:
    (base,) = scenario.listed_jobs(1)
    meta = json.loads(base.comment)["nuro"]
    meta["team"] = team
    if resume_from is not None:
        meta["resume_from"] = str(resume_from)
    return dataclasses.replace(base, job_id=job_id, account=team, comment=comment_json(meta))


def _bridge(client: FakeMlflow, jobs: list[JobInfo]) -> Bridge:
    return Bridge(client, lambda: jobs, lambda ids: [], lambda team, job, since: [])  # type: ignore[arg-type]


def test_a_run_resumed_from_its_own_teams_job_is_its_child() -> None:
    client = FakeMlflow()
    bridge = _bridge(client, [_job(10, "perception"), _job(11, "perception", resume_from=10)])
    bridge.sync_once()
    assert client.tags(bridge.runs[11].run_id)[mirror.TAG_PARENT] == bridge.runs[10].run_id
    # a restarted bridge (no memory of runs) finds the same parent by search in the team's experiment
    fresh = _bridge(client, [_job(12, "perception", resume_from=10)])
    fresh.sync_once()
    assert client.tags(fresh.runs[12].run_id)[mirror.TAG_PARENT] == bridge.runs[10].run_id


def test_a_team_cannot_name_another_teams_run_as_its_parent() -> None:
    """prediction's job 21 names perception's job 20: both in one pass (the bridge remembers job 20's run) and
    after a bridge restart (it searches): no parent either way, and perception's run is untouched."""
    client = FakeMlflow()
    bridge = _bridge(client, [_job(20, "perception"), _job(21, "prediction", resume_from=20)])
    bridge.sync_once()
    victim = bridge.runs[20].run_id
    assert mirror.TAG_PARENT not in client.tags(bridge.runs[21].run_id)
    assert bridge.runs[21].experiment_id != bridge.runs[20].experiment_id
    fresh = _bridge(client, [_job(22, "prediction", resume_from=20)])
    fresh.sync_once()
    assert mirror.TAG_PARENT not in client.tags(fresh.runs[22].run_id)
    assert all(victim not in v for r in client.runs.values() for v in client.tags(r["info"]["run_id"]).values())


def test_a_search_answer_from_another_experiment_is_not_trusted() -> None:
    """Defence in depth: should the server's search ever answer with a run of another experiment (a filter bug,
    a proxy), the bridge still links nothing."""
    client = FakeMlflow()
    bridge = _bridge(client, [_job(30, "perception")])
    bridge.sync_once()
    other = client.runs[bridge.runs[30].run_id]
    leaky = _bridge(client, [_job(31, "prediction", resume_from=30)])
    leaky.client.find_run = lambda exp, tag, value: other if value == "30" else None  # type: ignore[method-assign]
    leaky.sync_once()
    assert mirror.TAG_PARENT not in client.tags(leaky.runs[31].run_id)
