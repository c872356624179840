"""The `routeopt` subcommands, one module per area, and the options they share."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from routeopt.evals.config import ConfigError, default_config_path

CONFIG_OPTION = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Config file (default: $ROUTEOPT_CONFIG, ./routeopt.yaml, else the bundled demo fleet).",
)
DB_OPTION = click.option(
    "--db",
    "db_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="DuckDB file (default: db_path from the config).",
)


def console() -> Any:
    """A rich console for stdout; wide when piped, so tables in logs are not cut to 80 columns."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=200)


def load_config_or_exit(config_path: Path | None) -> Any:
    """The config at `config_path` (or the default one); a bad file is a one-line CLI error."""
    from routeopt.evals.config import load_config

    try:
        return load_config(config_path or default_config_path())
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def resolve_db(config_path: Path | None, given: Path | None) -> Path:
    """--db, else the config's `db_path`."""
    return Path(given) if given else load_config_or_exit(config_path).db_path


def open_store(path: Path, *, read_only: bool, missing: str = "run `routeopt run` first") -> Any:
    """The outcome store, or one clear error: the file is missing (for a reader; `missing` says
    what to do), or another process holds DuckDB's writer lock. Readers (reports, exports,
    estimates) open it read-only and never take the writer's lock."""
    import duckdb

    from routeopt.evals.storage.store import Store

    if read_only and not Path(path).exists():
        raise click.ClickException(f"{path}: no outcome database; {missing}")
    try:
        return Store(path, read_only=read_only)
    except duckdb.Error as exc:
        raise click.ClickException(
            f"{path}: cannot open the database ({exc}); another routeopt process may hold it - "
            "wait for it, or pass --db with another file"
        ) from None


def signing_key_path(config_path: Path | None) -> Path | None:
    """The signing key of the config (`Config.signing_key_path`: its `publishing.signing_key`,
    `$ROUTEOPT_SIGNING_KEY` or `.routeopt/keys/signing_key.pem` beside it). Without a usable
    default config, `$ROUTEOPT_SIGNING_KEY` or None; a broken --config is an error."""
    from routeopt.evals.config import load_config

    if config_path is not None:
        return load_config_or_exit(config_path).signing_key_path()
    try:
        return load_config(default_config_path()).signing_key_path()
    except ConfigError:
        env = os.environ.get("ROUTEOPT_SIGNING_KEY")
        return Path(env) if env else None


def publishing_key(
    given: Path | None, config_path: Path | None, *, create_for: Any = None, allow_unsigned: bool = False
) -> Any:
    """The private key a publishing command signs with: --signing-key, else the config's key
    (created on first use for the registry `create_for`, see `registry_signing_key`). None only
    with `allow_unsigned` and no key at all."""
    from routeopt.artifacts.publish.registry import RegistryError, registry_signing_key
    from routeopt.artifacts.serving.signatures import SigningError, public_key_path
    from routeopt.artifacts.publish.signing_keys import load_private_key

    path = given or signing_key_path(config_path)
    try:
        if path is not None and create_for is not None and given is None:
            key, created = registry_signing_key(create_for, path)
            if created:
                click.echo(
                    f"created the signing key {path} (keep it secret); gateways verify with "
                    f"{public_key_path(path)}",
                    err=True,
                )
            return key
        if given is not None or (path is not None and path.exists()):
            return load_private_key(path)  # type: ignore[arg-type]
    except (SigningError, RegistryError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    if allow_unsigned:
        return None
    where = f" at {path}" if path is not None else ""
    unsigned = (
        ""
        if create_for is not None
        else (" (--allow-unsigned writes an unsigned pointer, which gateways refuse)")
    )
    raise click.ClickException(
        f"no signing key{where}: give --signing-key or set ROUTEOPT_SIGNING_KEY{unsigned}"
    )


def verification_keys(given: tuple[Path, ...], config_path: Path | None, allow_unsigned: bool) -> list | None:
    """The public keys a command that loads policies trusts: --public-key, else
    `$ROUTEOPT_PUBLIC_KEY` (read by the loader), else the public key beside the config's signing
    key. Without any, only `allow_unsigned` goes on (the loader then checks no signature)."""
    from routeopt.artifacts.serving.signatures import public_key_path

    if given:
        return list(given)
    if os.environ.get("ROUTEOPT_PUBLIC_KEY"):
        return None
    private = signing_key_path(config_path)
    if private is not None and public_key_path(private).exists():
        return [public_key_path(private)]
    if allow_unsigned:
        return None
    where = f" (`routeopt run` creates it at {public_key_path(private)})" if private else ""
    raise click.ClickException(
        f"no public key to verify the policy with{where}: give --public-key "
        f"or set ROUTEOPT_PUBLIC_KEY; --allow-unsigned loads it unverified"
    )
