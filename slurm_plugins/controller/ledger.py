"""The controller's preemptions in flight, in a small file of its own that survives its restart.

Why a file and not the victim's job comment (issue 30): the comment is the job's own 1,024 bytes; a borrower who
filled it made the controller's mark fail ("parameter too long"), so the victim was never signalled and the lender
never got its GPUs back. The ledger is the controller's: only it writes it (root-only directory and file), its size
depends only on how many preemptions are in flight, and a restarted controller reads it back to finish them: a
victim that acknowledged is requeued at once, one that did not at grace end, one that ended or started again is
forgotten (``preemption.finish_in_flight``).

Format (``nuro.preemptions/v1``), one JSON object, rewritten whole (temp file, fsync, rename, fsync of the dir) on
every change: ``{"format": ..., "preempting": {"<victim job id>": {"at": unix_s, "for": claimant job id}}}``.
A missing file is an empty ledger; an unreadable or malformed one is logged and treated as empty (the victims'
GraceTime in Slurm still holds them to account), never a reason not to start.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from nuro.safeio.safefs import write_private

log = logging.getLogger(__name__)

FORMAT = "nuro.preemptions/v1"
FILE_NAME = "preemptions.json"
#: What ``load`` reads at most: ~60 bytes an entry, so room for tens of thousands of victims in flight.
MAX_BYTES = 4 << 20


class Ledger:
    """``load()`` once at start; ``save(preempting)`` whenever the in-flight set changes (no write otherwise)."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.path = self.dir / FILE_NAME
        self._saved: dict[int, tuple[int, int | None]] | None = None
        self._read: tuple[int | None, dict[int, tuple[float, int | None]]] = (None, {})

    def current(self) -> dict[int, tuple[float, int | None]]:
        """``load()`` for a reader beside the controller (the MLflow bridge), read again only when the file
        changed; {} without one."""
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except OSError:
            return {}
        if mtime != self._read[0]:
            self._read = (mtime, self.load())
        return self._read[1]

    def load(self) -> dict[int, tuple[float, int | None]]:
        """victim job id -> (signalled at, for job id); {} when there is no ledger or it cannot be read."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            self._saved = {}
            return {}
        except OSError as exc:
            log.error("preemption ledger %s unreadable (%s): starting with none in flight", self.path, exc)
            return {}
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
        try:
            if len(raw) > MAX_BYTES:
                raise ValueError(f"larger than {MAX_BYTES} bytes")
            obj = json.loads(raw)
            if not isinstance(obj, dict) or obj.get("format") != FORMAT:
                raise ValueError(f"format is not {FORMAT}")
            out: dict[int, tuple[float, int | None]] = {}
            for key, v in obj.get("preempting", {}).items():
                at, for_job = v["at"], v.get("for")
                if not key.isdigit() or type(at) is not int or (for_job is not None and type(for_job) is not int):
                    raise ValueError(f"bad entry {key!r}: {v!r:.80}")
                out[int(key)] = (float(at), for_job)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.error("preemption ledger %s malformed (%s): starting with none in flight", self.path, exc)
            return {}
        self._saved = {j: (int(at), f) for j, (at, f) in out.items()}
        return out

    def save(self, preempting: Mapping[int, float], claims: Mapping[int, int | None]) -> bool:
        """Write the in-flight set when it differs from what was last written; True when written. Raises OSError
        (the caller logs it: a victim is signalled anyway, Slurm's GraceTime is the backstop)."""
        want = {int(j): (round(at), claims.get(j)) for j, at in preempting.items()}
        if want == self._saved:
            return False
        body = {
            "format": FORMAT,
            "preempting": {str(j): {"at": at, "for": f} for j, (at, f) in sorted(want.items())},
        }
        write_private(self.dir, FILE_NAME, json.dumps(body, separators=(",", ":")).encode())
        self._saved = want
        return True


__all__ = ["FILE_NAME", "FORMAT", "Ledger"]
