"""``nuro-healthcheck``: Slurm's HealthCheckProgram, also run from the prolog/epilog (``--mode prolog|epilog``).

slurmd runs it with only ``SLURMD_NODENAME`` in the environment (no PATH, no SLURM_CONF), once per node every
HealthCheckInterval, and ignores its output; so it loads the node settings file (``$NURO_ENV_FILE``, see
``nuro.protocol.nodeenv``), sets a PATH itself, and acts on its own: on problems it drains the node with a precise
reason (``nuro-health: gpu1: temperature 93 C ≥ 90 C``) and exits 1; when healthy it resumes the node only if it is
drained with a ``nuro-health:`` reason (never an admin's drain) and exits 0.

Settings (command line wins over the environment, which wins over the default):

==============================  ===========================  ==========================================
variable                        option                       meaning / default
==============================  ===========================  ==========================================
``NURO_EXPECT_GPUS``            ``--expect-gpus N``          GPUs the node must have; unset = no expectation
``NURO_HEALTH_PROBE``           ``--probe``                  auto | nvml | none (default auto)
``NURO_STAGING_ROOT``                                        staging dir; default /var/tmp/nuro-staging
``NURO_STAGING_MIN_FREE_GB``                                 least free GiB on its disk; default 20
``NURO_AGENT_STATUS_DIR``                                    agent liveness checked only when set
``NURO_HEALTH_MAX_TEMPERATURE_C``                            ``Limits.max_temperature_c`` (90)
``NURO_AGENT_SILENT_S``                                      ``Limits.agent_silent_s`` (10)
``NURO_AGENT_START_GRACE_S``                                 ``Limits.agent_start_grace_s`` (30)
==============================  ===========================  ==========================================

A staging disk below ``NURO_STAGING_MIN_FREE_GB`` that running jobs' staging dirs account for fails those jobs
(largest first, until the floor would be met: ``checks.disk_verdict``) instead of draining the node: each is
cancelled with the reason in its job comment (``refused``), in the event log (``$NURO_EVENT_LOG``, kind
``job_disk_full``) and in the log. Only space no job accounts for drains the node.

Exit status (``nuro.console.ExitCode``): 0 healthy, 1 unhealthy (drained unless ``--dry-run``), 2 bad usage or
settings.

The check itself is a library (``nuro.healthcheck.run`` measures and evaluates, ``nuro.healthcheck.act`` drains,
resumes and fails disk jobs), shared with the prolog/epilog and the node agent; this module is only the command.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import replace

from nuro.console import ExitCode
from nuro.healthcheck.act import SLURM_TIMEOUT_S, act
from nuro.healthcheck.run import DEFAULT_PATH, HealthSettings, check_node
from nuro.protocol.nodeenv import load_node_env
from nuro.slurm import CliBackend, SlurmError

log = logging.getLogger("nuro.healthcheck")


def _parser() -> argparse.ArgumentParser:
    what = "Slurm's HealthCheckProgram for a GPU node, also run from the prolog and epilog (--mode prolog|epilog)."
    p = argparse.ArgumentParser(prog="nuro-healthcheck", description=what)
    p.add_argument("--node", help="node name (default: $SLURMD_NODENAME)")
    p.add_argument("--mode", choices=("periodic", "prolog", "epilog"), default="periodic")
    p.add_argument("--probe", choices=("auto", "nvml", "none"), help="GPU probe (default $NURO_HEALTH_PROBE or auto)")
    p.add_argument("--expect-gpus", type=int, help="GPUs this node must have (default $NURO_EXPECT_GPUS)")
    p.add_argument("--probe-timeout-s", type=float, default=5.0, help="the most the GPU probe may take")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON on stdout")
    p.add_argument("--dry-run", action="store_true", help="evaluate and report; do not drain or resume")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    """The command; returns its exit status, which slurmd and scripts branch on (module docstring)."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s nuro-healthcheck %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    try:
        load_node_env()
    except (OSError, ValueError) as exc:
        log.error("cannot read node settings $NURO_ENV_FILE: %s", exc)
        return ExitCode.USAGE
    os.environ.setdefault("PATH", DEFAULT_PATH)
    node = args.node or os.environ.get("SLURMD_NODENAME")
    if not node:
        log.error("no node name: pass --node NAME (slurmd sets SLURMD_NODENAME for HealthCheckProgram)")
        return ExitCode.USAGE
    try:
        settings = HealthSettings.from_env()
    except ValueError as exc:
        log.error("bad node setting: %s", exc)
        return ExitCode.USAGE
    if args.probe:
        settings = replace(settings, probe=args.probe)
    if args.expect_gpus is not None:
        settings = replace(settings, expected_gpus=args.expect_gpus)
    outcome = check_node(node, settings, args.mode, args.probe_timeout_s)
    try:
        outcome = act(outcome, CliBackend(timeout_s=SLURM_TIMEOUT_S), dry_run=args.dry_run)
    except (SlurmError, RuntimeError) as exc:
        # Slurm unreachable: the verdict still stands (exit status), the node state could not be changed.
        outcome = replace(outcome, action="failed", detail=f"could not read or change the node state: {exc}")
        log.error("node=%s %s", node, outcome.detail)
    if args.json:
        print(json.dumps(outcome.to_dict(), indent=2, ensure_ascii=False))
    level = logging.INFO if outcome.healthy else logging.WARNING
    log.log(
        level,
        "node=%s mode=%s healthy=%s action=%s problems=%s",
        node,
        args.mode,
        outcome.healthy,
        outcome.action,
        "; ".join(p.message for p in outcome.problems) or "-",
    )
    return ExitCode.OK if outcome.healthy else ExitCode.FAILED


if __name__ == "__main__":
    sys.exit(main())
