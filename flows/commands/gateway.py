"""`routeopt gateway serve`: the decision service, for gateways that cannot embed Python.

The options live in `routeopt.artifacts.serving.service_main` (argparse), shared with `routeopt-gateway serve` of
the gateway-only install, so both commands take exactly the same options and variables.
"""

from __future__ import annotations

import sys

import click


@click.group("gateway")
def gateway_group() -> None:
    """Serve routing decisions to gateways (nginx, Envoy, Kong...) over HTTP."""


@gateway_group.command(
    "serve",
    add_help_option=False,
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def serve(args: tuple[str, ...]) -> None:
    """POST /v1/route answers the policy's decision; `routeopt gateway serve --help` lists the options."""
    from routeopt.artifacts.serving.service_main import main

    sys.exit(main(list(args), prog="routeopt gateway serve"))
