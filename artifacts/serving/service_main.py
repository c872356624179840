"""`routeopt-gateway serve` / `routeopt gateway serve`: run the decision service over HTTP.

One parser serves both commands: the gateway-only install has no click, pydantic or config file,
so the options are plain argparse, and every option has an environment variable (see
`routeopt.artifacts.serving.settings`), which is how containers are configured.

    ROUTEOPT_POLICY=https://policies.internal/ ROUTEOPT_PUBLIC_KEY=/keys/public_key.pem \\
        routeopt-gateway serve --host 0.0.0.0 --port 8700 --model-header x-ai-eg-model
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Callable

from routeopt.artifacts.serving.settings import GatewaySettings, SettingsError
from routeopt.artifacts.serving.route_request import ALIAS
from routeopt.artifacts.serving.loader import PolicyLoadError
from routeopt.artifacts.serving.decision_service import (
    DecisionService,
    ServiceOptions,
    SharedObservations,
    WorkerShare,
)
from routeopt.artifacts.serving.service_metrics import SharedMetrics
from routeopt.artifacts.serving.http_server import Handler, Limits, Serving, bind, serve_workers


def build_parser(prog: str = "routeopt-gateway serve") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Serve routeopt decisions over HTTP (POST /v1/route, /healthz, /readyz, /metrics).",
    )
    p.add_argument(
        "--policy", help="Registry folder or URL, or one version folder (default: $ROUTEOPT_POLICY)."
    )
    p.add_argument(
        "--public-key",
        action="append",
        default=[],
        metavar="PEM",
        help="Trusted public key; repeat while rotating keys (default: $ROUTEOPT_PUBLIC_KEY).",
    )
    p.add_argument(
        "--channel", help="Registry channel (default: $ROUTEOPT_CHANNEL, else champion, else latest)."
    )
    p.add_argument(
        "--default-model",
        help="Model to serve while no valid policy is there "
        "(default: $ROUTEOPT_DEFAULT_MODEL; without one the service waits unready).",
    )
    p.add_argument(
        "--refresh-s",
        type=float,
        help="Seconds between registry polls (default: $ROUTEOPT_REFRESH_S, else 30; 0 never polls).",
    )
    p.add_argument(
        "--allow-unsigned",
        action="store_true",
        default=None,
        help="Accept unsigned policies when no public key is given.",
    )
    p.add_argument("--log-dir", help="Folder for JSONL decision logs (default: $ROUTEOPT_DECISION_LOG_DIR).")
    p.add_argument(
        "--alias",
        default=ALIAS,
        help="The model name that asks for routing (default: %(default)s); "
        "a request naming another model passes through unrouted.",
    )
    p.add_argument(
        "--model-header",
        action="append",
        default=[],
        metavar="NAME",
        help="Also answer the chosen model under this header (e.g. x-ai-eg-model); repeatable.",
    )
    p.add_argument(
        "--require-suite",
        action="store_true",
        help="Refuse (400) requests that name no suite instead of routing them without one.",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=16 << 20,
        help="Largest request body read (default: %(default)s); larger ones get 413.",
    )
    p.add_argument("--host", default=os.environ.get("ROUTEOPT_SERVICE_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("ROUTEOPT_SERVICE_PORT", "8700")))
    p.add_argument(
        "--workers",
        type=int,
        default=int(os.environ.get("ROUTEOPT_SERVICE_WORKERS", "1")),
        help="Processes serving the port (default: $ROUTEOPT_SERVICE_WORKERS, else 1); "
        "one per core the service may use. Each loads the policy and keeps its own metrics and decision log.",
    )
    p.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    return p


def make_service(args: argparse.Namespace, shared: WorkerShare | None = None) -> DecisionService:
    """The service the options describe (raises SettingsError for an unusable value)."""
    if args.max_body_bytes < 1:
        raise SettingsError("--max-body-bytes must be at least 1")
    settings = GatewaySettings.from_env(
        source=args.policy,
        public_keys=tuple(args.public_key) or None,
        channel=args.channel,
        default_model=args.default_model,
        refresh_s=args.refresh_s,
        allow_unsigned=args.allow_unsigned,
        log_dir=args.log_dir,
    )
    options = ServiceOptions(
        alias=args.alias,
        require_suite=args.require_suite,
        max_body_bytes=args.max_body_bytes,
        model_headers=tuple(args.model_header),
    )
    return DecisionService(settings, options=options, shared=shared)


def main(argv: list[str] | None = None, prog: str = "routeopt-gateway serve") -> int:
    args = build_parser(prog).parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        if args.workers < 1:
            raise SettingsError(f"--workers is {args.workers}; give at least 1")
        service = make_service(args)
        if args.workers == 1:  # before binding the port: a configuration error stops here, clearly
            service.start()
    except (SettingsError, PolicyLoadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    limits = Limits(max_body_bytes=args.max_body_bytes)
    try:
        sock = bind(args.host, args.port)
    except OSError as exc:
        service.close()
        print(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if args.workers == 1:
        state = "ready" if service.ready else f"not ready ({service.not_ready_reason})"
        print(
            f"routeopt decision service on http://{args.host}:{args.port} ({state})",
            file=sys.stderr,
            flush=True,
        )
        Serving(sock, service.respond, limits).run(on_stop=service.close)
        return 0

    # made before the fork: live latency seen by one worker reaches all, /metrics counts them all
    observations, metrics = SharedObservations(), SharedMetrics(args.workers)

    def start_worker(index: int) -> tuple[Handler, Callable[[], None]]:
        """In each worker, after the fork: the policy's threads and compiled kernels do not
        survive one, so the parent never loads it."""
        try:
            worker = make_service(args, WorkerShare(observations, metrics, index))
            worker.start()
        except (SettingsError, PolicyLoadError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        return worker.respond, worker.close

    print(
        f"routeopt decision service on http://{args.host}:{args.port} ({args.workers} workers)",
        file=sys.stderr,
        flush=True,
    )
    return serve_workers(sock, args.workers, start_worker, limits)


def cli() -> None:
    """The `routeopt-gateway` console script: `routeopt-gateway serve [OPTIONS]`."""
    argv = sys.argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: routeopt-gateway serve [OPTIONS]   (routeopt-gateway serve --help for the options)")
        sys.exit(0 if argv else 2)
    if argv[0] != "serve":
        print(f"routeopt-gateway: unknown command {argv[0]!r}; the command is `serve`", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(argv[1:]))


if __name__ == "__main__":
    cli()
