"""``nuro-train``: launch and follow training runs from a login node.

Subcommands come from small modules (one concern each) and are mounted here. Shell completion is click's:
``eval "$(_NURO_TRAIN_COMPLETE=bash_source nuro-train)"`` (zsh: ``zsh_source``, fish: ``fish_source``).
"""

from __future__ import annotations

import logging

import click

from nuro.login import metrics_cli, runs_cli
from nuro.login.dataset_cli import dataset
from nuro.login.events_cli import events
from nuro.login.resume_cli import resume
from nuro.login.submit_cli import submit


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log debug detail (the exact argv of every Slurm call).")
def main(verbose: bool) -> None:
    """Launch and follow nuro training runs."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )


for _command in runs_cli.COMMANDS:
    main.add_command(_command)
main.add_command(dataset)
main.add_command(submit)
main.add_command(resume)
main.add_command(events)
for _command in metrics_cli.COMMANDS:
    main.add_command(_command)


if __name__ == "__main__":
    main()
