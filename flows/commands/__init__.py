"""The `routeopt` subcommands, one module per area, and the options they share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from evals.config import ConfigError, default_config_path

CONFIG_OPTION = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Config file (default: $ROUTEOPT_CONFIG, ./routeopt.yaml, else the bundled demo fleet).",
)
DB_OPTION = click.option(
    "--db", "db_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="DuckDB file (default: db_path from the config).",
)


def load_config_or_exit(config_path: Path | None) -> Any:
    """The config at `config_path` (or the default one); a bad file is a one-line CLI error."""
    from evals.config import load_config

    try:
        return load_config(config_path or default_config_path())
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
