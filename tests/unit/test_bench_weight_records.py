"""The weight-records bench's reader of sdiag (bench/bench_weight_records.py), on sdiag output captured from a
22.05 dev cluster at 256 nodes with 1,000 jobs pending."""

from __future__ import annotations

from pathlib import Path

from bench.bench_weight_records import parse_sdiag

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "sdiag_22.05.txt"


def test_main_and_backfill_cycles_are_read_from_their_own_sections() -> None:
    got = parse_sdiag(FIXTURE.read_text())
    assert got["main"] == {"cycles": 4, "mean_us": 7742, "max_us": 9146, "mean_depth": 775}
    assert got["backfill"]["cycles"] == 2 and got["backfill"]["mean_us"] == 2860812
    assert got["backfill"]["depth_mean"] == 94 and got["backfill"]["try_depth_mean"] == 94


def test_a_section_sdiag_did_not_print_is_left_out() -> None:
    assert parse_sdiag("Main schedule statistics (microseconds):\n\tTotal cycles: 3\n") == {"main": {"cycles": 3}}
