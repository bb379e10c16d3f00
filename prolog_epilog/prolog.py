"""Slurm Prolog (``PrologFlags=Alloc``: once per allocated node before the job starts).

For now it only succeeds: a non-zero exit would drain the node and requeue the job. Later work validates the
job's nuro metadata, creates the staging dir and stages the latest valid checkpoint. It must stay cheap: it runs
on every node of every job, so it imports nothing heavy.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    return 0


if __name__ == "__main__":
    sys.exit(main())
