"""Straggler detection inside the job (issue 16 item 1, first part): the pure score and rule, and two real gloo ranks
through DDP's communication hook — a rank 1.3x slower is flagged within two windows, an even run never is."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import pytest

from nuro.wrappers.sdk.stragglers import MovePolicy, StragglerRule, StragglerWatch, slowdowns
from tests.gloo import run_two_ranks


def test_slowdowns_are_against_the_fastest_rank_and_skip_ranks_without_a_measure() -> None:
    assert slowdowns([0.10, 0.13, 0.10]) == pytest.approx([1.0, 1.3, 1.0])
    got = slowdowns([0.2, math.nan, 0.0])
    assert got[0] == 1.0 and math.isnan(got[1]) and math.isnan(got[2])
    assert all(math.isnan(x) for x in slowdowns([math.nan, math.nan]))


def test_a_rank_is_flagged_only_after_sustained_windows_and_cleared_the_same_way() -> None:
    rule = StragglerRule(threshold=1.2, sustain=2)
    assert rule.update([1.0, 1.5]) == ([], [])  # one slow window is noise
    assert rule.update([1.0, 1.1]) == ([], [])  # and it reset
    assert rule.update([1.0, 1.3]) == ([], [])
    assert rule.update([1.0, 1.3]) == ([1], [])  # two in a row: a straggler, reported once
    assert rule.update([1.0, 1.4]) == ([], [])
    assert rule.update([1.0, 1.0]) == ([], [])
    assert rule.update([math.nan, 1.0]) == ([], [1])  # two windows back under: cleared
    assert rule.flagged == set()


TWO_RANKS = textwrap.dedent("""
    import json, os, sys, time
    from datetime import timedelta
    import torch, torch.distributed as dist
    from nuro.wrappers.sdk.stragglers import StragglerWatch, timed_collective
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank = dist.get_rank()
    slow = float(sys.argv[1]) if rank == 1 else 1.0
    torch.manual_seed(0)
    net = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    events = []
    watch = StragglerWatch(window=10, record=lambda kind, **f: events.append([kind, f])).attach(net)
    for step in range(int(sys.argv[2])):
        loss = net(torch.randn(8, 32)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        time.sleep(0.1 * slow)  # the stand-in compute: rank 1 is 'slow' times slower (0.1 s: scheduling noise on a
        # busy 2-core box stays well under the threshold; 0.04 s was seen at 1.4x in an even run)
        watch.observe(skip=(step == 35))
        with timed_collective():  # a per-step sync point outside the hook, like the Checkpointer's "save now?"
            dist.broadcast(torch.zeros(1), src=0)
    print(json.dumps({"rank": rank, "events": events, "history": watch.history, "nodes": watch.nodes}), flush=True)
    dist.barrier()
    # DDP (its reducer and the comm hook's futures) goes before the group: left to interpreter shutdown, torch 2.13
    # sometimes aborts with "terminate called without an active exception" after the work is done
    del watch, opt, net
    import gc; gc.collect()
    dist.destroy_process_group()
""")


def _run(tmp_path: Path, slow: float, steps: int) -> list[dict]:
    script = tmp_path / "two.py"
    script.write_text(TWO_RANKS)
    return [json.loads(line) for line in run_two_ranks(script, str(slow), str(steps))]


def test_a_slower_rank_is_flagged_by_rank_zero_within_two_windows(tmp_path: Path) -> None:
    # 1.5x, not the bench's 1.3x: the threshold is 1.2, and a unit test on a loaded CI box needs the margin (the
    # 1.3x detection time is bench/bench_stragglers.py's measure, on a quiet box)
    zero, one = _run(tmp_path, 1.5, 40)
    assert zero["history"] == one["history"]  # every rank computes the same scores
    flagged = [f for kind, f in zero["events"] if kind == "straggler"]
    # at or above the 1.2 threshold by the rule; under the 1.5x it is (a loaded box inflates the fast rank too)
    assert [f["rank"] for f in flagged] == [1] and 1.2 <= flagged[0]["slowdown"] < 1.8, zero
    assert one["events"] == []  # only rank 0 records
    assert len(zero["history"]) == 4 and all(w[0] == 1.0 for w in zero["history"])


def test_an_even_run_flags_nobody(tmp_path: Path) -> None:
    zero, _ = _run(tmp_path, 1.0, 60)
    assert zero["events"] == [], zero["history"]
    assert max(max(w) for w in zero["history"]) < 1.2


class _Guard:
    def __init__(self) -> None:
        self.moves: list[str] = []

    def request_move(self, node: str) -> None:
        self.moves.append(node)


def _flag_rank_one(steps_left: int, monkeypatch: pytest.MonkeyPatch) -> tuple[_Guard, list, StragglerWatch]:
    """Two windows with rank 1 at 1.5x (sustain 2) on rank 0, 0.1 s steps, ``steps_left`` to go."""
    monkeypatch.setenv("RANK", "0")
    guard, events = _Guard(), []
    watch = StragglerWatch(record=lambda kind, **f: events.append((kind, f)),
                           move=MovePolicy(guard, checkpoint_s=lambda: 1.0, restart_s=5.0))  # fmt: skip
    watch.nodes = ["gpu001", "gpu002"]
    for _ in range(2):
        watch._walls = [0.1] * 20
        watch._steps_left = steps_left
        watch._report([1.0, 1.5])
    return guard, events, watch


def test_a_straggler_on_a_long_run_is_moved_away_from(monkeypatch: pytest.MonkeyPatch) -> None:
    guard, events, watch = _flag_rank_one(10_000, monkeypatch)  # ~1000 s left: staying loses ~333 s, moving ~6 s
    kinds = [k for k, _ in events]
    assert kinds == ["straggler", "straggler_decision"] and guard.moves == ["gpu002"]
    decision = events[1][1]
    assert decision["move"] is True and decision["node_of_rank"] == "gpu002" and decision["move_cost_s"] == 6.0
    watch.history.append([1.0, 1.5])
    assert watch.fields() == {"straggler_slowdown": 1.5, "straggler_rank": 1.0, "straggler_move": 1.0}


def test_a_straggler_near_the_end_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    guard, events, _ = _flag_rank_one(30, monkeypatch)  # 3 s left: staying loses 1 s, moving costs 6 s
    decision = dict(events)["straggler_decision"]
    assert decision["move"] is False and decision["why"].startswith("not worth moving") and guard.moves == []


def test_the_restart_cost_follows_the_spares(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NURO_RESTART_COST_S", raising=False)
    monkeypatch.setenv("NURO_SPARE_NODES", "1")
    assert MovePolicy(_Guard()).restart_s == 5.0
    monkeypatch.setenv("NURO_SPARE_NODES", "0")
    assert MovePolicy(_Guard()).restart_s == 20.0
    monkeypatch.setenv("NURO_SPARE_NODES", "1")
    monkeypatch.setenv("NURO_SPARES_LEFT", "0")  # the job had one, a swap used it: a move now requeues
    assert MovePolicy(_Guard()).restart_s == 20.0
    monkeypatch.setenv("NURO_RESTART_COST_S", "7.5")
    assert MovePolicy(_Guard()).restart_s == 7.5


@pytest.mark.parametrize("raw", ["7.5s", "-1", "nan", "inf"])
def test_a_malformed_restart_cost_is_an_error_not_the_default(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("NURO_RESTART_COST_S", raw)
    with pytest.raises(ValueError, match=r"NURO_RESTART_COST_S=.* is not a number of seconds ≥ 0; unset it"):
        MovePolicy(_Guard())
    monkeypatch.setenv("NURO_RESTART_COST_S", " ")
    assert MovePolicy(_Guard(), restart_s=3.0).restart_s == 3.0
