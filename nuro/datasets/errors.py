"""Dataset errors, typed by what the user can do about them (the CLI maps each to an exit code)."""

from __future__ import annotations


class DatasetError(RuntimeError):
    """Base of every dataset failure; the message says what is wrong and what to do."""


class InvalidInput(DatasetError, ValueError):
    """A name, tag, reference or source path that nuro refuses (CLI exit 2: fix the input)."""


class DatasetNotFound(DatasetError):
    """No such dataset, tag or snapshot in the store (CLI exit 4)."""


class TagConflict(DatasetError):
    """A tag exists or moved concurrently, so it was not changed (CLI exit 1)."""


class SourceChanged(DatasetError):
    """A file changed while it was being snapshotted; nothing refers to the partial upload (CLI exit 1)."""


class IntegrityError(DatasetError):
    """Stored bytes do not hash to their name, or a manifest is malformed (CLI exit 1)."""
