"""Run events: keys sort by time within a job, bodies round-trip, only rank 0 of a nuro job records."""

from __future__ import annotations

import pytest

from nuro.lifecycle import run_events
from nuro.lifecycle.run_events import RunEvent


def test_key_orders_by_time_within_the_job() -> None:
    a = RunEvent(ts=1796000000.5, kind="started", job_id=42, restart=0)
    b = RunEvent(ts=1796000010.25, kind="restored", job_id=42, restart=1, fields={"step": 30})
    ka, kb = run_events.event_key("perception", "bev-1", a), run_events.event_key("perception", "bev-1", b)
    assert ka == "runs/perception/bev-1/events/42/1796000000500-r0-started.json"
    assert ka < kb


def test_body_round_trips_and_keeps_kind_fields() -> None:
    ev = RunEvent(ts=1.5, kind="restored", job_id=7, restart=2, node="gpu003", fields={"step": 30, "source": "s3"})
    back = run_events.decode(run_events.encode(ev))
    assert back == ev and back.step == 30


@pytest.mark.parametrize("data", [b"", b"[]", b'{"kind": "x"}', b"\xff", b'{"ts": "soon", "kind": "a", "job_id": 1}'])
def test_objects_that_are_not_events_are_skipped(data: bytes) -> None:
    assert run_events.decode(data) is None


def test_names_that_could_escape_the_prefix_are_refused() -> None:
    with pytest.raises(ValueError, match="bad run name '../x'"):
        run_events.run_prefix("perception", "../x")


def test_only_rank_zero_of_a_nuro_job_records() -> None:
    job = {"NURO_TEAM": "perception", "NURO_RUN_NAME": "bev-1", "SLURM_JOB_ID": "42"}
    # no store is touched in these cases, so none is needed
    assert run_events.record("started", env={**job, "RANK": "1"}) is False
    assert run_events.record("started", env={"RANK": "0", "SLURM_JOB_ID": "42"}) is False
    with pytest.raises(ValueError, match="unknown run event kind"):
        run_events.record("exploded", env=job)


def test_an_event_recorded_later_is_sent_before_the_process_exits(tmp_path) -> None:  # noqa: ANN001
    """record_later sends on a daemon thread, which dies with the interpreter: a run that ends right after recording
    (its last progress, its snapshots event) lost the event whenever the store was slower than the rest of the
    process. The exit now waits for it (up to EXIT_WAIT_S)."""
    import subprocess
    import sys
    import textwrap

    sent = tmp_path / "sent"
    child = textwrap.dedent(f"""
        import time
        from nuro.lifecycle import run_events

        class SlowStore:
            def put_if_absent(self, key, body):
                time.sleep(0.5)
                open({str(sent)!r}, "w").write(key)

        env = {{"NURO_TEAM": "perception", "NURO_RUN_NAME": "bev-1", "SLURM_JOB_ID": "42"}}
        run_events.record_later("progress", store=SlowStore(), env=env, step=7)
    """)
    res = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert sent.read_text().startswith("runs/perception/bev-1/events/42/"), "the event died with the process"


def test_the_exit_wait_is_bounded() -> None:
    import threading

    gate = threading.Event()

    class StuckStore:
        def put_if_absent(self, key: str, body: bytes) -> None:
            gate.wait(10)

    env = {"NURO_TEAM": "perception", "NURO_RUN_NAME": "bev-1", "SLURM_JOB_ID": "42"}
    run_events.record_later("progress", store=StuckStore(), env=env, step=7)
    assert run_events.wait_sent(0.2) == 1  # still sending: the exit goes on after the bound
    gate.set()
    assert run_events.wait_sent(5) == 0
