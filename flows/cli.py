"""The `routeopt` command line. Each area keeps its commands in `flows/commands/<area>.py`.

Heavy modules (torch, prefect, lightgbm) are imported inside the commands, so `--help` is fast.
"""

from __future__ import annotations

import os
import sys
from importlib import import_module

import click

# The temporary Prefect server's telemetry heartbeat races its own first SQLite writes and
# prints a traceback on start; this machine sends telemetry nowhere anyway. Users may set it.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

# "module:attribute" of each click command or group added to the top-level group.
COMMANDS: list[str] = [
    "routeopt.flows.commands.ops:export_group",
    "routeopt.flows.commands.ops:drift_cmd",
    "routeopt.flows.commands.ops:report_cmd",
    "routeopt.flows.commands.ops:deploy_cmd",
    "routeopt.flows.commands.gpu:bench",
    "routeopt.flows.commands.gpu:cost",
    "routeopt.flows.commands.init:init",
    "routeopt.flows.commands.pipeline:run",
    "routeopt.flows.commands.pipeline:eval_cmd",
    "routeopt.flows.commands.artifacts:policies",
    "routeopt.flows.commands.artifacts:keys",
    "routeopt.flows.commands.artifacts:registry_group",
    "routeopt.flows.commands.gateway:gateway_group",
    "routeopt.flows.commands.suites:suites",
    "routeopt.flows.commands.zoo:zoo",
    "routeopt.flows.commands.router:import_group",
    "routeopt.flows.commands.router:train",
    "routeopt.flows.commands.router:bench",
    "routeopt.flows.commands.router:route",
]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="routeopt")
def cli() -> None:
    """routeopt: find, per request, the cheapest LLM that will pass your evals.

    The nightly pipeline evaluates suites across candidate models, stores outcomes in DuckDB,
    trains a router and publishes a versioned routing policy that gateways pull.
    """


# Modules that add subcommands to the groups above (`import`, `policies`, `cost`).
EXTENSIONS: list[str] = ["routeopt.flows.commands.traffic", "routeopt.flows.commands.replay"]

for _target in COMMANDS:
    _module, _, _attr = _target.partition(":")
    cli.add_command(getattr(import_module(_module), _attr))
for _module in EXTENSIONS:
    import_module(_module)


def main() -> None:
    try:
        cli(prog_name="routeopt")
    finally:
        _ready_to_exit()


def _ready_to_exit() -> None:
    """Close the stores a command left open, then freeze the heap. Interpreter shutdown runs full
    garbage collections over every object still alive: after `routeopt run` printed its summary
    they took 2.3 s (torch, Prefect, the run's frames). Frozen objects are not scanned; none of
    them needs a finalizer (the DuckDB stores are closed here; decision logs, tracing and
    Prefect's workers flush in atexit handlers, which still run)."""
    import gc

    nightly = sys.modules.get("routeopt.flows.nightly")  # imported by the commands that keep stores
    if nightly is not None:
        nightly.close_stores()
    gc.freeze()


if __name__ == "__main__":
    main()
