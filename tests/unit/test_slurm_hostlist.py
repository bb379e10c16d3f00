"""Hostlist expansion/compression: pure functions, checked against the forms Slurm prints."""

from __future__ import annotations

import pytest

from nuro.slurm.hostlist import HostlistError, compress, expand


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        ("gpu001", ["gpu001"]),
        ("gpu[001-004,007],login1", ["gpu001", "gpu002", "gpu003", "gpu004", "gpu007", "login1"]),
        ("gpu[001-002],cpu[1-2]", ["gpu001", "gpu002", "cpu1", "cpu2"]),
        ("n[098-100]", ["n098", "n099", "n100"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
        ("rack[1-2]-ib", ["rack1-ib", "rack2-ib"]),
        ("a[1,3,5-6]", ["a1", "a3", "a5", "a6"]),
        ("leaf[01-02]", ["leaf01", "leaf02"]),
        ("gpu001 gpu002", ["gpu001", "gpu002"]),
    ],
    ids=lambda v: str(v),
)
def test_expand(expr: str, want: list[str]) -> None:
    assert expand(expr) == want


@pytest.mark.parametrize("empty", ["", "   ", "(null)", "None assigned", None])
def test_expand_empty_forms_mean_no_hosts(empty: str | None) -> None:
    # squeue prints "" for pending jobs, sacct "None assigned", scontrol "(null)".
    assert expand(empty) == []


@pytest.mark.parametrize("bad", ["gpu[001-002", "gpu001]", "gpu[a-b]", "gpu[3-1]", "gpu[[1-2]]", "gpu[1,,2]"])
def test_expand_rejects_malformed(bad: str) -> None:
    with pytest.raises(HostlistError):
        expand(bad)


@pytest.mark.parametrize(
    ("hosts", "want"),
    [
        (["gpu003", "gpu001", "gpu002", "gpu007", "login1"], "gpu[001-003,007],login1"),
        (["gpu001"], "gpu001"),
        (["n098", "n099", "n100"], "n[098-100]"),
        (["n8", "n9", "n10"], "n[8-10]"),
        (["a1", "a1", "a2"], "a[1-2]"),
        (["login", "gpu01", "gpu02"], "login,gpu[01-02]"),
        ([], ""),
    ],
)
def test_compress(hosts: list[str], want: str) -> None:
    assert compress(hosts) == want


@pytest.mark.parametrize(
    "expr", ["gpu[001-004,007],login1", "n[098-100]", "r1n01,r1n02,r2n01", "gpu[1-3,10-12]", "x,y,z[001-003]"]
)
def test_round_trip_keeps_the_set(expr: str) -> None:
    assert sorted(expand(compress(expand(expr)))) == sorted(set(expand(expr)))
