"""``nuro-healthcheck``: Slurm's HealthCheckProgram.

Slurm runs it with only ``SLURMD_NODENAME`` in the environment (no PATH, no SLURM_CONF), once per node every
HealthCheckInterval. For now it reports healthy; GPU probes, staging-disk space and agent liveness come with the
survive work, and then it drains the node with a precise reason.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    return 0


if __name__ == "__main__":
    sys.exit(main())
