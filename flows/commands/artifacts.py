"""`routeopt policies ...`, `routeopt keys generate`, `routeopt registry serve`: the publishing side."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from routeopt.flows.commands import CONFIG_OPTION, publishing_key, verification_keys


def _default_registry(config_path: Path | None = None) -> str:
    """The registry of --config (else of the default config): what --registry and a SOURCE
    default to, as `routeopt run` publishes there."""
    from routeopt.evals.config import ConfigError, default_config_path, load_config

    try:
        return str(load_config(config_path or default_config_path()).registry_dir)
    except ConfigError as exc:
        raise click.UsageError(f"give --registry (no usable config: {exc})") from None


REGISTRY = click.option(
    "--registry",
    "registry",
    default=None,
    envvar="ROUTEOPT_REGISTRY",
    help="Registry folder or s3://bucket/prefix (default: $ROUTEOPT_REGISTRY, "
    "else registry_dir from the config).",
)
SIGNING_KEY = click.option(
    "--signing-key",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Ed25519 private key (default: the config's "
    "publishing.signing_key, $ROUTEOPT_SIGNING_KEY, or .routeopt/keys/signing_key.pem "
    "beside the config).",
)
ALLOW_UNSIGNED_MOVE = click.option(
    "--allow-unsigned",
    is_flag=True,
    help="Without any signing key, write an unsigned pointer (gateways "
    "refuse it unless they also allow unsigned policies).",
)
PUBLIC_KEY = click.option(
    "--public-key",
    "public_keys",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Trusted Ed25519 public key, repeatable while rotating keys (default: "
    "$ROUTEOPT_PUBLIC_KEY, else public_key.pem beside the config's signing key).",
)
ALLOW_UNSIGNED_LOAD = click.option(
    "--allow-unsigned",
    is_flag=True,
    help="Load without checking signatures when no public key is found "
    "(hashes, expiry and order are still checked).",
)


def _fail(exc: Exception) -> None:
    click.echo(f"error: {exc}", err=True)
    sys.exit(1)


def _echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=True, default=str))


@click.group()
def policies() -> None:
    """List, inspect, compare, promote, roll back and verify published routing policies."""


@policies.command("list")
@REGISTRY
@CONFIG_OPTION
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_cmd(registry: str | None, config_path: Path | None, as_json: bool) -> None:
    """Every version with its channels and headline held-out metrics."""
    from routeopt.artifacts.publish.registry import list_versions

    try:
        rows = list_versions(registry or _default_registry(config_path))
    except (ValueError, RuntimeError) as exc:
        _fail(exc)
    if as_json:
        _echo_json(rows)
        return
    click.echo(
        f"{'version':>7}  {'created_at':<20}  {'digest':<12}  {'signed':<6}  "
        f"{'pass_rate':>9}  {'cost_usd':>10}  channels"
    )
    for r in rows:
        m = r["metrics"]
        pr = "-" if m["pass_rate"] is None else f"{m['pass_rate']:.4f}"
        cost = "-" if m["cost_usd"] is None else f"{m['cost_usd']:.4g}"
        click.echo(
            f"{r['version']:>7}  {r['created_at']:<20}  {r['digest'][:12]:<12}  "
            f"{'yes' if r['signed'] else 'no':<6}  {pr:>9}  {cost:>10}  {','.join(r['channels'])}"
        )


@policies.command()
@click.argument("version", type=int)
@REGISTRY
@CONFIG_OPTION
def show(version: int, registry: str | None, config_path: Path | None) -> None:
    """Print a version's manifest (files, lineage, metrics, policy description)."""
    from routeopt.artifacts.publish.registry import show as show_version

    try:
        _echo_json(show_version(registry or _default_registry(config_path), version))
    except (ValueError, RuntimeError) as exc:
        _fail(exc)


@policies.command()
@click.argument("a", type=int)
@click.argument("b", type=int)
@REGISTRY
@CONFIG_OPTION
def diff(a: int, b: int, registry: str | None, config_path: Path | None) -> None:
    """What changed from version A to B: candidates, thresholds, metrics, lineage."""
    from routeopt.artifacts.publish.registry import diff as diff_versions

    try:
        d = diff_versions(registry or _default_registry(config_path), a, b)
    except (ValueError, RuntimeError) as exc:
        _fail(exc)
    cands = d.pop("candidates")
    click.echo(f"candidates: added {cands['added']}, removed {cands['removed']}")
    for section, changes in d.items():
        click.echo(f"{section}: {len(changes)} changed")
        for key, (old, new) in changes.items():
            click.echo(f"  {key}: {_short(old)} -> {_short(new)}")


def _short(value: Any, width: int = 70) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= width else text[: width - 3] + "..."


@policies.command()
@click.argument("version", type=int)
@click.option("--channel", default="champion", show_default=True)
@click.option(
    "--allow-downgrade",
    is_flag=True,
    help="Move the channel to an older version (recorded as a signed rollback).",
)
@click.option(
    "--require",
    type=click.Choice(["shadow", "canary"]),
    default=None,
    help="Move only if VERSION's shadow or canary on live traffic (decisions and feedback "
    "in the store) is not worse than the champion's.",
)
@click.option(
    "--db",
    "db_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="DuckDB store with decisions and feedback (default: from the config).",
)
@click.option("--since", default=None, help="With --require: only decisions since this ISO date/time.")
@click.option(
    "--min-feedback",
    type=click.IntRange(min=1),
    default=None,
    help="With --require: requests with feedback needed (default: traffic.min_feedback).",
)
@click.option(
    "--margin",
    type=click.FloatRange(0, 1),
    default=None,
    help="With --require: how much lower a pass rate may be, shown with 95% confidence "
    "(default: publishing.promote_tolerance).",
)
@REGISTRY
@SIGNING_KEY
@ALLOW_UNSIGNED_MOVE
@CONFIG_OPTION
def promote(
    version: int,
    channel: str,
    allow_downgrade: bool,
    require: str | None,
    db_path: Path | None,
    since: str | None,
    min_feedback: int | None,
    margin: float | None,
    registry: str | None,
    signing_key: Path | None,
    allow_unsigned: bool,
    config_path: Path | None,
) -> None:
    """Point CHANNEL at VERSION (atomically; gateways polling the channel pick it up)."""
    from routeopt.artifacts.publish.registry import move_channel

    registry = registry or _default_registry(config_path)
    if require is not None:
        _require_live(registry, version, require, db_path, since, min_feedback, margin, config_path)
    key = publishing_key(signing_key, config_path, allow_unsigned=allow_unsigned)
    try:
        p = move_channel(
            registry,
            channel,
            version,
            action="promote",
            signing_key=key,
            allow_downgrade=allow_downgrade,
            allow_unsigned=allow_unsigned,
        )
    except (ValueError, RuntimeError) as exc:
        _fail(exc)
    assert p is not None
    click.echo(f"{channel} -> version {p.version} ({p.action}, move #{p.seq})")


def _require_live(
    registry: str,
    version: int,
    kind: str,
    db_path: Path | None,
    since: str | None,
    min_feedback: int | None,
    margin: float | None,
    config_path: Path | None,
) -> None:
    """Exit with the reason unless VERSION's shadow or canary result allows the promotion."""
    from routeopt.artifacts.publish.promotion import rollout_evidence
    from routeopt.artifacts.publish.registry import current_pointer
    from routeopt.evals.config import ConfigError, default_config_path, load_config
    from routeopt.evals.storage.store import Store
    from routeopt.evals.storage.traffic import load_traffic

    try:
        cfg = load_config(config_path or default_config_path())
    except ConfigError as exc:
        raise click.UsageError(f"--require needs a config: {exc}") from None
    path = Path(db_path or cfg.db_path)
    if not path.exists():
        _fail(RuntimeError(f"{path}: no database with logged decisions; import them first"))
    pointer, _ = current_pointer(registry, "champion")
    with Store(path, read_only=True) as store:
        frame = load_traffic(store, since=since)
    ok, why, _ = rollout_evidence(
        frame,
        version,
        pointer.version if pointer else None,
        kind,
        margin=cfg.publishing.promote_tolerance if margin is None else margin,
        min_feedback=min_feedback or cfg.traffic.min_feedback,
        since=since,
    )
    if not ok:
        _fail(RuntimeError(f"not promoted: {kind}: {why}"))
    click.echo(f"{kind}: {why}")


@policies.command("rollback")
@click.option("--channel", default="champion", show_default=True)
@REGISTRY
@SIGNING_KEY
@ALLOW_UNSIGNED_MOVE
@CONFIG_OPTION
def rollback_cmd(
    channel: str,
    registry: str | None,
    signing_key: Path | None,
    allow_unsigned: bool,
    config_path: Path | None,
) -> None:
    """Move CHANNEL back to the version it held before the current one."""
    from routeopt.artifacts.publish.registry import rollback

    key = publishing_key(signing_key, config_path, allow_unsigned=allow_unsigned)
    try:
        p = rollback(
            registry or _default_registry(config_path),
            channel,
            signing_key=key,
            allow_unsigned=allow_unsigned,
        )
    except (ValueError, RuntimeError) as exc:
        _fail(exc)
    click.echo(f"{channel} -> version {p.version} (rollback, move #{p.seq})")


@policies.command()
@click.argument("source", required=False)
@PUBLIC_KEY
@ALLOW_UNSIGNED_LOAD
@CONFIG_OPTION
@click.option("--channel", default=None, help="Channel of a registry (default: champion, else latest).")
def verify(
    source: str | None,
    public_keys: tuple[Path, ...],
    allow_unsigned: bool,
    config_path: Path | None,
    channel: str | None,
) -> None:
    """Check SOURCE (version folder, registry folder, s3:// or http(s) URL; default: the
    config's registry) exactly as a gateway does."""
    from routeopt.artifacts.serving.loader import PolicyLoadError, check

    source = source or _default_registry(config_path)
    keys = verification_keys(public_keys, config_path, allow_unsigned)
    try:
        report = check(source, keys, channel=channel, allow_unsigned=allow_unsigned)
    except (PolicyLoadError, ValueError, RuntimeError) as exc:
        _fail(exc)
    for key, value in report.items():
        click.echo(f"{key}: {value}")
    click.echo("OK")


@click.group()
def keys() -> None:
    """Signing keys for policies."""


@keys.command()
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path))
def generate(out_dir: Path) -> None:
    """Write signing_key.pem (keep secret; point ROUTEOPT_SIGNING_KEY at it) and public_key.pem."""
    from routeopt.artifacts.serving.signatures import SigningError, key_id, load_public_key
    from routeopt.artifacts.publish.signing_keys import generate_keys

    try:
        private, public = generate_keys(out_dir)
    except SigningError as exc:
        _fail(exc)
    click.echo(f"private key: {private} (mode 0600; set ROUTEOPT_SIGNING_KEY={private})")
    click.echo(f"public key:  {public} (key id {key_id(load_public_key(public))}; give it to gateways)")


@click.group("registry")
def registry_group() -> None:
    """Serve a registry folder to gateways over HTTP."""


@registry_group.command()
@REGISTRY
@CONFIG_OPTION
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8600, show_default=True, type=int)
def serve(registry: str | None, config_path: Path | None, host: str, port: int) -> None:
    """Read-only HTTP with ETag / If-None-Match so polling gateways mostly get 304s."""
    from routeopt.artifacts.publish.registry_server import serve_forever

    serve_forever(Path(registry or _default_registry(config_path)), host, port)
