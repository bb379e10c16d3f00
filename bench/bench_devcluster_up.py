"""Time to `devcluster up` (all nodes idle) with packages present, optionally absent, and `down`.

    python bench/bench_devcluster_up.py [--nodes 8] [--packages-absent]

--packages-absent first removes the Debian packages (apt-get remove) so `up` must install them: destructive for
this machine's Slurm install, so opt-in, and never run by CI.
"""

from __future__ import annotations

import argparse
import os
import subprocess

from bench.common import REPO, save, timed
from nuro.devcluster import manager
from nuro.devcluster.install import PACKAGES
from nuro.devcluster.layout import Layout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--port-base", type=int, default=28800)
    ap.add_argument("--packages-absent", action="store_true")
    args = ap.parse_args()
    layout = Layout(REPO / ".devcluster-bench" / f"up{args.nodes}")
    manager.down(layout, purge=True)
    if args.packages_absent:
        subprocess.run(
            ["apt-get", "remove", "-y", "-qq", *PACKAGES], env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            check=True, capture_output=True,
        )  # fmt: skip
    res = manager.up(layout, args.nodes, args.port_base, timeout_s=600)
    status = manager.status(layout)
    down_s = timed(lambda: manager.down(layout, purge=True))
    save(
        f"devcluster_up_{args.nodes}{'_fresh_install' if args.packages_absent else ''}",
        {
            "nodes": args.nodes,
            "packages": "absent (installed by up)" if args.packages_absent else "present",
            "installed": res.installed,
            "up_to_all_idle_s": round(res.seconds_to_idle, 2),
            "daemons_started_s": round(res.seconds_to_daemons, 2),
            "processes": len(status["processes"]),
            "down_s": round(down_s, 2),
        },
    )


if __name__ == "__main__":
    main()
