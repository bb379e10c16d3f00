"""Import names that code outside this repository holds: they must keep working across refactors.

Slurm re-runs a job's stored batch script on every requeue (``python -m nuro.wrappers.launch``), and training code
is pinned to a commit that ``nuro-train resume`` runs again months later (the SDK, ``from nuro import runevents``).
"""

from __future__ import annotations

import importlib
import importlib.util

import nuro.lifecycle.run_events


def test_runevents_is_the_run_events_module() -> None:
    from nuro import runevents

    assert runevents is nuro.lifecycle.run_events
    assert importlib.import_module("nuro.runevents") is nuro.lifecycle.run_events


def test_the_launcher_and_the_sdk_keep_their_names() -> None:
    assert importlib.util.find_spec("nuro.wrappers.launch") is not None  # python -m nuro.wrappers.launch
    sdk = {
        "nuro.wrappers.sdk.checkpointer": "Checkpointer",
        "nuro.wrappers.sdk.metrics": "MetricsLogger",
        "nuro.wrappers.sdk.preemption": "PreemptionGuard",
        "nuro.wrappers.sdk.runenv": "RunEnv",
    }
    for module, name in sdk.items():
        assert hasattr(importlib.import_module(module), name), f"{module}.{name}"
