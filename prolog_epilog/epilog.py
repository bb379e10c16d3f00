"""Slurm Epilog (once per allocated node after the job ends).

For now it only succeeds (a non-zero exit drains the node). Later work flushes the job's pending checkpoint
uploads before the node is released, cleans the staging dir and runs the health check.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    return 0


if __name__ == "__main__":
    sys.exit(main())
