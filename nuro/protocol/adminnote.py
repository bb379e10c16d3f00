"""Root's notes to a job's owner in Slurm's ``admin_comment``: why the job is being preempted, why a node refused it.

Why this field: only root and SlurmUser may set a job's ``admin_comment`` (a user's ``scontrol update`` of it is
refused), so a tenant cannot fill it, and its owner can read it (``scontrol show job``, ``nuro-train status``,
``nuro-job show``). It is a *note*, never state: nothing nuro decides reads it back (the controller's in-flight
preemptions live in its own ledger, ``slurm_plugins/controller/ledger.py``). So a note that Slurm refuses or a
later note that replaces it costs the owner an explanation, never a decision.

Form: one canonical JSON object with one key (``NOTE_PREEMPT`` or ``NOTE_REFUSED``), read by the comment's one
parser (``nuro.protocol.jobcomment.record``). Each note replaces the field whole (no read-merge-write, which would
race between the controller and a node's prolog, and cost a read on the controller's preemption path); its
``why`` is cut so the whole note fits ``MAX_NOTE_BYTES`` (Slurm's 1,024-byte cap on the field, root included).
"""

from __future__ import annotations

from typing import Any

from nuro.protocol import jobcomment
from nuro.protocol.contract import NOTE_PREEMPT, NOTE_REFUSED

#: A note's size: all of Slurm's cap on ``admin_comment`` (one note at a time holds it).
MAX_NOTE_BYTES = jobcomment.SLURM_TEXT_MAX
KEYS = (NOTE_PREEMPT, NOTE_REFUSED)
_CUT = "..."


def render(key: str, why: str, **fields: int | str | None) -> str:
    """The note ``{key: {**fields, "why": why}}`` in canonical form, ``why`` cut (at a character boundary, with
    "...") so the whole is at most ``MAX_NOTE_BYTES``. ``fields`` are whole numbers or short strings."""
    if key not in KEYS:
        raise ValueError(f"admin note key {key!r} is not one of {KEYS}")
    body: dict[str, Any] = {k: v for k, v in fields.items() if v is not None}
    text = why.replace("\n", " ").replace("\r", " ")

    def note(why_text: str) -> str:
        return jobcomment.canonical({key: {**body, "why": why_text}})

    if len(note(text).encode()) <= MAX_NOTE_BYTES:
        return note(text)
    if len(note(_CUT).encode()) > MAX_NOTE_BYTES:
        raise ValueError(f"admin note {key}: its fields alone are above {MAX_NOTE_BYTES} bytes")
    lo, hi = 0, len(text)  # the longest prefix that fits with "..." (escapes make bytes per character vary)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(note(text[:mid] + _CUT).encode()) <= MAX_NOTE_BYTES:
            lo = mid
        else:
            hi = mid - 1
    return note(text[:lo] + _CUT)


def parse(text: str | None) -> dict[str, dict[str, Any]]:
    """The note in an admin comment, ``{key: fields}``, or {} for anything that is not one (another admin's text)."""
    obj = jobcomment.record(text)
    if obj is None:
        return {}
    return {k: v for k, v in obj.items() if k in KEYS and isinstance(v, dict)}


__all__ = ["KEYS", "MAX_NOTE_BYTES", "parse", "render"]
