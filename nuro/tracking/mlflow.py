"""The MLflow tracking server, through its REST API (``/api/2.0/mlflow``): the one adapter nuro uses to reach MLflow.

Why REST and not the ``mlflow`` package: the client library pulls ~850 MB (pandas, pyarrow, scipy, scikit-learn)
into every environment that imports it; the handful of calls nuro makes are plain JSON over HTTP, with urllib3
(already a dependency, for InfluxDB). The server is MLflow's own (``mlflow server``), in its own venv.

Calls are synchronous with a short timeout and no retries: the caller (the bridge's buffered loop) owns retrying,
so a server that is down costs a bounded wait, never a hang. ``log_batch`` splits to the API's limits (1,000
metrics, 100 params, 100 tags, 1,000 entities per call).

Errors: ``MlflowUnavailable`` (no answer, 5xx, 429: try again later), ``MlflowRejected`` (4xx: the request itself
is wrong and will stay wrong), both ``MlflowError``.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import urllib3

log = logging.getLogger(__name__)

MAX_METRICS, MAX_PARAMS, MAX_TAGS, MAX_ENTITIES = 1000, 100, 100, 1000
MAX_PARAM_VALUE = 6000  # MLflow 2.x+ (older servers: 500)
MAX_TAG_VALUE = 8000


class MlflowError(RuntimeError):
    """A call to the tracking server failed; the message names the call and the server's answer."""


class MlflowUnavailable(MlflowError):
    """No answer, a 5xx or a 429: worth trying again later."""


class MlflowRejected(MlflowError):
    """A 4xx: the request is wrong (or not allowed) and will stay so."""


@dataclass(frozen=True)
class Metric:
    key: str
    value: float
    timestamp_ms: int
    step: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "timestamp": self.timestamp_ms, "step": self.step}


def _kv(items: Mapping[str, str], limit: int) -> list[dict[str, str]]:
    return [{"key": k, "value": str(v)[:limit]} for k, v in items.items()]


def batches(
    metrics: Sequence[Metric], params: Mapping[str, str], tags: Mapping[str, str]
) -> list[dict[str, list[dict[str, Any]]]]:
    """``log_batch`` bodies within the API's per-call limits (pure)."""
    out: list[dict[str, list[dict[str, Any]]]] = []
    p, t, m = _kv(params, MAX_PARAM_VALUE), _kv(tags, MAX_TAG_VALUE), [x.to_json() for x in metrics]
    while p or t or m or not out:
        body: dict[str, list[dict[str, Any]]] = {"params": p[:MAX_PARAMS], "tags": t[:MAX_TAGS]}
        p, t = p[MAX_PARAMS:], t[MAX_TAGS:]
        room = MAX_ENTITIES - len(body["params"]) - len(body["tags"])
        body["metrics"], m = m[: min(room, MAX_METRICS)], m[min(room, MAX_METRICS) :]
        out.append(body)
        if not (p or t or m):
            break
    return out


class MlflowClient:
    """One tracking server. ``base_url`` like ``http://127.0.0.1:5000``; ``user``/``password`` for a server behind
    basic auth (``mlflow server --app-name basic-auth`` or a proxy), else ``token`` as a Bearer token."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 5.0,
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = urllib3.PoolManager(
            num_pools=2, maxsize=4, retries=False, timeout=urllib3.Timeout(connect=2.0, read=timeout_s)
        )
        self._headers = {"Content-Type": "application/json"}
        if user is not None:
            cred = base64.b64encode(f"{user}:{password or ''}".encode()).decode()
            self._headers["Authorization"] = f"Basic {cred}"
        elif token:
            self._headers["Authorization"] = f"Bearer {token}"

    def _request(self, method: str, url: str, what: str, *, body: bytes | None = None,
                 fields: Mapping[str, str] | None = None, content_type: str = "application/json") -> Any:  # fmt: skip
        """One HTTP call, its failure classified (``MlflowUnavailable``/``MlflowRejected``); the response."""
        headers = {**self._headers, "Content-Type": content_type}
        try:
            resp = self._http.request(method, url, body=body, fields=fields, headers=headers)
        except urllib3.exceptions.HTTPError as exc:
            raise MlflowUnavailable(f"MLflow {what}: no answer from {self.base_url}: {exc}") from None
        if resp.status >= 500 or resp.status == 429:
            raise MlflowUnavailable(f"MLflow {what}: HTTP {resp.status}: {resp.data[:300]!r}")
        if resp.status >= 400:
            raise MlflowRejected(f"MLflow {what}: HTTP {resp.status}: {resp.data.decode(errors='replace')[:300]}")
        return resp

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None,
              fields: Mapping[str, str] | None = None, api: str = "2.0") -> dict[str, Any]:  # fmt: skip
        url = f"{self.base_url}/api/{api}/mlflow/{path}"
        data = None if method == "GET" else json.dumps(body or {}).encode()
        resp = self._request(method, url, path, body=data, fields=fields if method == "GET" else None)
        text = resp.data.decode("utf-8", errors="replace")
        try:
            out = json.loads(text) if text else {}
        except ValueError:
            raise MlflowUnavailable(f"MLflow {path}: not JSON: {text[:200]}") from None
        return out if isinstance(out, dict) else {}

    # -- experiments -------------------------------------------------------------------------------------------
    def experiment_id(self, name: str, *, create: bool = True, tags: Mapping[str, str] | None = None) -> str | None:
        """The id of experiment ``name`` (created when missing and ``create``); None when missing. With ``create``,
        ``tags`` are set on an experiment that exists with other values (one made before a tag was added)."""
        try:
            got = self._call("GET", "experiments/get-by-name", fields={"experiment_name": name})
            exp_id = str(got["experiment"]["experiment_id"])
            have = {t.get("key"): t.get("value") for t in got["experiment"].get("tags") or []}
            for key, value in (tags or {}).items() if create else ():
                if have.get(key) != value:
                    self._call("POST", "experiments/set-experiment-tag",
                               {"experiment_id": exp_id, "key": key, "value": value})  # fmt: skip
            return exp_id
        except MlflowRejected as exc:
            if "RESOURCE_DOES_NOT_EXIST" not in str(exc):
                raise
            if not create:
                return None
        body: dict[str, Any] = {"name": name}
        if tags:
            body["tags"] = _kv(tags, MAX_TAG_VALUE)
        try:
            return str(self._call("POST", "experiments/create", body)["experiment_id"])
        except MlflowRejected as exc:  # created meanwhile by another writer
            if "RESOURCE_ALREADY_EXISTS" in str(exc):
                return self.experiment_id(name, create=False)
            raise

    # -- runs --------------------------------------------------------------------------------------------------
    def create_run(self, experiment_id: str, name: str, *, start_ms: int | None = None,
                   tags: Mapping[str, str] | None = None) -> str:  # fmt: skip
        body = {"experiment_id": experiment_id, "run_name": name, "start_time": start_ms or int(time.time() * 1000),
                "tags": _kv(tags or {}, MAX_TAG_VALUE)}  # fmt: skip
        return str(self._call("POST", "runs/create", body)["run"]["info"]["run_id"])

    def get_run(self, run_id: str) -> dict[str, Any]:
        return self._call("GET", "runs/get", fields={"run_id": run_id})["run"]

    def update_run(self, run_id: str, *, status: str | None = None, end_ms: int | None = None,
                   name: str | None = None) -> None:  # fmt: skip
        body: dict[str, Any] = {"run_id": run_id}
        if status:
            body["status"] = status
        if end_ms:
            body["end_time"] = end_ms
        if name:
            body["run_name"] = name
        self._call("POST", "runs/update", body)

    def log_batch(self, run_id: str, metrics: Sequence[Metric] = (), params: Mapping[str, str] | None = None,
                  tags: Mapping[str, str] | None = None) -> int:  # fmt: skip
        """Log everything in as few calls as the limits allow; the number of calls."""
        calls = batches(metrics, params or {}, tags or {})
        for body in calls:
            self._call("POST", "runs/log-batch", {"run_id": run_id, **body})
        return len(calls)

    def delete_tag(self, run_id: str, key: str) -> None:
        self._call("POST", "runs/delete-tag", {"run_id": run_id, "key": key})

    def log_dataset(self, run_id: str, *, name: str, digest: str, source: str, source_type: str = "s3",
                    context: str = "training", profile: str | None = None) -> None:  # fmt: skip
        dataset: dict[str, Any] = {"name": name, "digest": digest, "source_type": source_type, "source": source}
        if profile:
            dataset["profile"] = profile
        body = {"run_id": run_id, "datasets": [{"tags": [{"key": "mlflow.data.context", "value": context}],
                                                "dataset": dataset}]}  # fmt: skip
        self._call("POST", "runs/log-inputs", body)

    def search_runs(self, experiment_ids: Iterable[str], filter_string: str = "", max_results: int = 1000,
                    page_token: str | None = None) -> tuple[list[dict[str, Any]], str | None]:  # fmt: skip
        body: dict[str, Any] = {"experiment_ids": list(experiment_ids), "filter": filter_string,
                                "max_results": max_results}  # fmt: skip
        if page_token:
            body["page_token"] = page_token
        got = self._call("POST", "runs/search", body)
        return list(got.get("runs") or []), got.get("next_page_token")

    def find_run(self, experiment_id: str, tag: str, value: str) -> dict[str, Any] | None:
        """The run of ``experiment_id`` whose tag ``tag`` is ``value`` (nuro's runs: ``nuro.job_id``), or None."""
        runs, _ = self.search_runs([experiment_id], f"tags.`{tag}` = {filter_value(value)}", max_results=1)
        return runs[0] if runs else None

    def metric_history(self, run_id: str, key: str) -> list[dict[str, Any]]:
        got = self._call("GET", "metrics/get-history", fields={"run_id": run_id, "metric_key": key,
                                                                "max_results": "25000"})  # fmt: skip
        return list(got.get("metrics") or [])

    def _artifact_url(self, experiment_id: str, run_id: str, name: str) -> str:
        return f"{self.base_url}/api/2.0/mlflow-artifacts/artifacts/{experiment_id}/{run_id}/artifacts/{name}"

    def put_artifact(self, experiment_id: str, run_id: str, name: str, data: bytes) -> None:
        """One file into the run's artifacts (a server with ``--serve-artifacts``: the proxied artifact store)."""
        url = self._artifact_url(experiment_id, run_id, name)
        self._request("PUT", url, f"artifact {name}", body=data, content_type="application/octet-stream")

    def get_artifact(self, experiment_id: str, run_id: str, name: str) -> bytes:
        return self._request("GET", self._artifact_url(experiment_id, run_id, name), f"artifact {name}").data

    # -- users and permissions (a server run with ``--app-name basic-auth``; the caller is its admin) -------------
    def ensure_user(self, username: str, password: str) -> bool:
        """Create ``username`` (True), or set its password when it exists (False)."""
        try:
            self._call("POST", "users/create", {"username": username, "password": password})
            return True
        except MlflowRejected as exc:
            if "RESOURCE_ALREADY_EXISTS" not in str(exc) and "already" not in str(exc):
                raise
        self._call("PATCH", "users/update-password", {"username": username, "password": password})
        return False

    def grant(self, username: str, experiment_id: str, permission: str) -> None:
        """``permission`` (READ, EDIT, MANAGE) for ``username`` on one experiment."""
        body = {"username": username, "resource_type": "experiment", "resource_id": experiment_id,
                "permission": permission}  # fmt: skip
        try:
            self._call("POST", "users/permissions/grant", body, api="3.0")
            return
        except MlflowRejected as exc:
            if "RESOURCE_ALREADY_EXISTS" not in str(exc):
                raise
        which = {k: body[k] for k in ("username", "resource_type", "resource_id")}
        held = self._call("GET", "users/permissions/get", fields=which, api="3.0").get("permission")
        if held != permission:  # a grant cannot be changed in place: revoke, grant again
            self._call("POST", "users/permissions/revoke", which, api="3.0")
            self._call("POST", "users/permissions/grant", body, api="3.0")

    def health(self) -> bool:
        try:
            resp = self._http.request("GET", f"{self.base_url}/health", headers=self._headers)
        except urllib3.exceptions.HTTPError:
            return False
        return resp.status == 200


def client_from_env(uri: str | None = None, env: Mapping[str, str] | None = None) -> MlflowClient:
    """The client of ``uri``, else ``MLFLOW_TRACKING_URI`` (MLflow's own variable), with MLflow's credential
    variables (``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD``, else ``MLFLOW_TRACKING_TOKEN``).

    Raises:
        MlflowError: no http(s) URL given.
    """
    env = os.environ if env is None else env
    url = uri or env.get("MLFLOW_TRACKING_URI", "")
    if not url.startswith(("http://", "https://")):
        raise MlflowError(f"no MLflow server: set MLFLOW_TRACKING_URI to http://HOST:PORT (got {url!r})")
    return MlflowClient(url, user=env.get("MLFLOW_TRACKING_USERNAME"), password=env.get("MLFLOW_TRACKING_PASSWORD"),
                        token=env.get("MLFLOW_TRACKING_TOKEN"))  # fmt: skip


def run_tags(run: Mapping[str, Any] | None) -> dict[str, str]:
    """A run's tags (``runs/get`` or ``runs/search`` shape) as a mapping; {} for no run."""
    return {t["key"]: t["value"] for t in ((run or {}).get("data") or {}).get("tags") or [] if "key" in t}


#: The MLflow UI's query that opens its model-training view (runs, model metrics, model registry). MLflow 3.x opens
#: an experiment in its GenAI view (traces, judges, prompts) unless the URL or the browser's last choice says
#: otherwise; older 3.x releases read the experiment's kind tag instead (``mirror.experiment_tags`` sets both).
TRAINING_VIEW = "workflowType=machine_learning"


def run_url(base_url: str, experiment_id: str, run_id: str, tab: str = "") -> str:
    """The run's page in the MLflow UI's training view; ``tab``: one of its tabs (e.g. ``model-metrics``)."""
    page = f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
    return f"{page}/{tab}?{TRAINING_VIEW}" if tab else f"{page}?{TRAINING_VIEW}"


def filter_value(value: str) -> str:
    """``value`` quoted for an MLflow search filter (single quotes; a quote inside is refused: nuro's ids never
    carry one)."""
    if "'" in value or "\\" in value:
        raise ValueError(f"cannot quote {value!r} in an MLflow filter")
    return f"'{value}'"


__all__ = [
    "Metric",
    "MlflowClient",
    "MlflowError",
    "MlflowRejected",
    "MlflowUnavailable",
    "batches",
    "client_from_env",
    "filter_value",
    "run_tags",
    "run_url",
]
