"""Phase 6: team fair share handed to Slurm as each pending job's SiteFactor.

Why SiteFactor: Slurm's own scheduler and backfill then order jobs by it, so the fair order holds even for the
decisions nuro does not make (which pending job starts next on freed GPUs). Slurm's fairshare factor already weighs
historical usage per account (shares ∝ quota); the site factor adds the *current* picture:

    entitlement_t = cluster_gpus × shares_t / Σ shares
    value_t       = round(SITE_FACTOR_MAX / (1 + held_t / entitlement_t))

so a team holding nothing gets 10000, one at its entitlement 5000, one at three times it 2500: monotone, bounded, and
never negative. ``held_t`` is the GPUs its running jobs hold (any QOS). A value is set only when it moved by at least
``SITE_FACTOR_STEP`` from the last one set for that job, so steady state costs no ``scontrol`` calls.
"""

from __future__ import annotations

from nuro.slurm_plugins.controller.cycle import Cycle
from nuro.slurm_plugins.controller.decisions import SetSiteFactor

SITE_FACTOR_MAX = 10_000
SITE_FACTOR_STEP = 100  # 1 % of the range: smaller moves are not worth a scontrol call per job


def site_factor_values(cy: Cycle) -> dict[str, int]:
    """The value per team (module docstring)."""
    teams = cy.index.teams
    total_shares = sum(t.shares for t in teams.values()) or 1
    out = {}
    for name, team in teams.items():
        entitlement = cy.policy.cluster_gpus * team.shares / total_shares
        held = cy.view.usage[name].held
        out[name] = round(SITE_FACTOR_MAX / (1 + held / entitlement)) if entitlement > 0 else 0
    return out


def set_site_factors(cy: Cycle) -> dict[int, int]:
    """Phase 6: ``SetSiteFactor`` for pending team jobs whose value moved; returns job id → value now in force
    (set this cycle or kept from before) for the next state."""
    values = site_factor_values(cy)
    previous = cy.state.site_factors
    in_force: dict[int, int] = {}
    for job in cy.view.pending:
        team = cy.view.cls(job).team
        if team is None:
            continue
        value = values[team]
        prev = previous.get(job.job_id)
        if prev is not None and abs(value - prev) < SITE_FACTOR_STEP:
            in_force[job.job_id] = prev
            continue
        in_force[job.job_id] = value
        cy.site_factors.append(
            SetSiteFactor(
                job.job_id,
                value,
                reason=f"team {team} holds {cy.view.usage[team].held} GPUs against its fair-share entitlement; "
                f"site factor {prev if prev is not None else 'unset'} → {value}",
            )
        )
    return in_force


__all__ = ["SITE_FACTOR_MAX", "SITE_FACTOR_STEP", "set_site_factors", "site_factor_values"]
