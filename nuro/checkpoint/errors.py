"""Checkpoint errors, typed by what the caller can do about them."""

from __future__ import annotations

from nuro.names import InvalidName


class CheckpointError(RuntimeError):
    """Base of every checkpoint failure; the message says what is wrong and what to do."""


class InvalidCheckpointInput(CheckpointError, InvalidName):
    """A team, run, step or path that nuro refuses (fix the input). An ``InvalidName`` (``nuro.names``): whoever
    catches a refused name catches it too."""


class ManifestError(CheckpointError):
    """A manifest, part record or upload request is malformed or inconsistent (it is never trusted)."""


class VerificationFailed(CheckpointError):
    """Stored bytes do not match the manifest (missing shard, wrong size or sha256)."""
