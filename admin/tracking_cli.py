"""``nuro-admin tracking``: the MLflow side of the team policy (``nuro.tracking.access``)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from nuro.console import ExitCode, fail
from nuro.policy import PolicyError, load_policy
from nuro.tracking.access import apply_access
from nuro.tracking.mlflow import MlflowError, client_from_env


@click.group("tracking")
def tracking_group() -> None:
    """MLflow, the runs' web UI (docs/tracking.md)."""


@tracking_group.command("access")
@click.argument("policy_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--credentials-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("/etc/nuro/mlflow"),
              show_default=True, help="Where each team's <team>.env (its MLflow account) is kept, 0640 "
              "root:nuro-<team>.")  # fmt: skip
@click.option("--tracking-uri", help="The server (default: $MLFLOW_TRACKING_URI; its admin in MLFLOW_TRACKING_USERNAME/"
              "MLFLOW_TRACKING_PASSWORD).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True)
def access(policy_file: Path, credentials_dir: Path, tracking_uri: str | None, as_json: bool) -> None:
    """Give every team of POLICY_FILE its experiment and an account that reads only it (a basic-auth server)."""
    try:
        teams = [t.name for t in load_policy(policy_file).teams]
        done = apply_access(client_from_env(tracking_uri), teams, credentials_dir)
    except PolicyError as exc:
        fail(ExitCode.INVALID, str(exc))
    except MlflowError as exc:
        fail(ExitCode.FAILED, str(exc))
    if as_json:
        click.echo(json.dumps(done, indent=2))
        return
    for team, d in done.items():
        click.echo(f"{team}: account {d['user']} ({'created' if d['created'] else 'kept'}) reads experiment "
                   f"{d['experiment_id']} only; credentials {credentials_dir / (team + '.env')}")  # fmt: skip
