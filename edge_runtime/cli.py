"""`python -m edge_runtime serve | models | check | examples`."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from edge_runtime import config as cfg
from edge_runtime.config import ConfigError, ServeConfig, load_models_file


def _serve_config(args: argparse.Namespace) -> ServeConfig:
    return ServeConfig(
        models_file=args.models,
        models=load_models_file(args.models),
        host=args.host,
        port=args.port,
        max_request_bytes=args.max_request_bytes,
        forward_timeout_seconds=args.forward_timeout_seconds,
        systemone_schema=args.systemone_schema,
        max_bundle_tasks=args.max_bundle_tasks,
        drain_seconds=args.drain_seconds,
        max_prep_queue=args.max_prep_queue,
        api_key_file=getattr(args, "api_key_file", None),
        metrics_require_key=getattr(args, "metrics_require_key", False),
        tls_cert=getattr(args, "tls_cert", None),
        tls_key=getattr(args, "tls_key", None),
        access_log=getattr(args, "access_log", True),
        watch_models=getattr(args, "watch_models", None),
        update_drain_seconds=getattr(args, "update_drain_seconds", cfg.DEFAULT_UPDATE_DRAIN_SECONDS),
        update_watch_seconds=getattr(args, "update_watch_seconds", cfg.DEFAULT_UPDATE_WATCH_SECONDS),
        rollback_error_rate=getattr(args, "rollback_error_rate", 0.05),
        rollback_p99_ratio=getattr(args, "rollback_p99_ratio", 3.0),
        rollback_min_requests=getattr(args, "rollback_min_requests", 50),
        memory_reserve_bytes=getattr(args, "memory_reserve_bytes", 0),
        update_policy=getattr(args, "update_policy", "beside"),
        admin_key_file=getattr(args, "admin_key_file", None),
        admin_host=getattr(args, "admin_host", cfg.DEFAULT_HOST),
        admin_port=getattr(args, "admin_port", cfg.DEFAULT_ADMIN_PORT),
        admin_package_root=getattr(args, "admin_package_root", None),
    )


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m edge_runtime", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("serve", "serve the models of a models file over HTTP"),
        ("models", "list what a models file would serve"),
        ("check", "load and self-check every model, then exit 0 (all ready) or 1"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--models", type=Path, default=Path("models.yaml"), help="models file (models.yaml)")
        p.add_argument("--host", default=cfg.DEFAULT_HOST)
        p.add_argument("--port", type=int, default=cfg.DEFAULT_PORT)
        p.add_argument("--max-request-bytes", type=int, default=cfg.DEFAULT_MAX_REQUEST_BYTES)
        p.add_argument("--forward-timeout-seconds", type=float, default=cfg.DEFAULT_FORWARD_TIMEOUT_SECONDS)
        p.add_argument("--systemone-schema", choices=cfg.SYSTEMONE_SCHEMAS, default="vllm-sr/5.0")
        p.add_argument("--max-bundle-tasks", type=int, default=cfg.DEFAULT_MAX_BUNDLE_TASKS)
        p.add_argument("--drain-seconds", type=float, default=cfg.DEFAULT_DRAIN_SECONDS,
                       help="on SIGTERM/SIGINT, how long accepted requests may take before queued work gets 503")
        p.add_argument("--max-prep-queue", type=_at_least_one, default=cfg.DEFAULT_MAX_PREP_QUEUE,
                       help="jobs that may wait for a preparation thread (body decoding and parsing, tokenizing, "
                            "media) before a request is refused overloaded (429)")
    serve = sub.choices["serve"]
    serve.add_argument("--api-key-file", type=Path, default=None,
                       help="require Authorization: Bearer <key> on /v1/*; one key per line, re-read on SIGHUP "
                            "(the environment variable EDGE_RUNTIME_API_KEY adds one more)")
    serve.add_argument("--metrics-require-key", action="store_true",
                       help="/metrics needs a key too (it is public by default, as /health is)")
    serve.add_argument("--tls-cert", type=Path, default=None, help="serve HTTPS with this PEM certificate (chain)")
    serve.add_argument("--tls-key", type=Path, default=None, help="the PEM private key of --tls-cert")
    serve.add_argument("--no-access-log", dest="access_log", action="store_false",
                       help="no JSON access line per request on stderr")
    up = serve.add_argument_group("model updates (docs/updating-models.md)")
    up.add_argument("--watch-models", type=_positive_seconds, default=None, metavar="SECONDS",
                    help="re-read the models file every SECONDS (it is re-read on SIGHUP in any case)")
    up.add_argument("--update-drain-seconds", type=_positive_seconds, default=cfg.DEFAULT_UPDATE_DRAIN_SECONDS,
                    help="how long a swapped-out version may finish its work before what is queued gets 503")
    up.add_argument("--update-watch-seconds", type=float, default=cfg.DEFAULT_UPDATE_WATCH_SECONDS,
                    help="after a promotion, keep the previous version this long and roll back automatically "
                         "on a regression (0: no watch)")
    up.add_argument("--rollback-error-rate", type=float, default=0.05,
                    help="roll back when the new version's error rate exceeds the old one's by this")
    up.add_argument("--rollback-p99-ratio", type=float, default=3.0,
                    help="roll back when the new version's p99 exceeds the old one's times this")
    up.add_argument("--rollback-min-requests", type=_at_least_one, default=50,
                    help="answers a new version gives before it is judged")
    up.add_argument("--memory-reserve-bytes", type=int, default=0,
                    help="memory kept free: a version that does not fit beside the others within the "
                         "rest is refused (409 insufficient_memory)")
    up.add_argument("--update-policy", choices=cfg.UPDATE_POLICIES, default="beside",
                    help="replace: when a new version does not fit beside the old, unload the old first "
                         "(a short gap, announced on /health) instead of refusing")
    up.add_argument("--admin-key-file", type=Path, default=None,
                    help="turn on the admin API (its own listener) with these keys; re-read on SIGHUP")
    up.add_argument("--admin-host", default=cfg.DEFAULT_HOST)
    up.add_argument("--admin-port", type=int, default=cfg.DEFAULT_ADMIN_PORT)
    up.add_argument("--admin-package-root", type=Path, default=None,
                    help="packages the admin API may load lie under this directory (default: the models "
                         "file's directory)")
    ex = sub.add_parser("examples", help="send the contract's Decisions examples to a server and check the answers")
    ex.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8100")
    ex.add_argument("--model", required=True, help="the decision model to ask (replaces the examples' model)")
    return parser


def _models(config: ServeConfig) -> int:
    from edge_runtime.families.registry import read_package
    from edge_runtime.packages import PackageError

    for m in config.models:
        try:
            card = read_package(m.package).card
            what = f"{card.family}/{card.kind} serves {','.join(card.surfaces)}"
        except PackageError as exc:
            what = f"unreadable package: {exc}"
        print(f"{m.name}\t{m.package}\tvariant={m.variant}\tdevice={m.device}\t{what}")
    return 0


def _check(config: ServeConfig) -> int:
    from edge_runtime.runtime import Runtime

    runtime = Runtime(config)
    runtime.load_all()
    for m in runtime.models.values():
        detail = m.reason or m.self_check.get("status", "")
        print(f"{m.name}\t{m.status}\t{detail}")
    return 0 if runtime.status() == "ready" else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = _parser().parse_args(argv)
    if args.command == "examples":
        from edge_runtime.examples import main as examples

        return examples(args.url, args.model)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = _serve_config(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.command == "models":
        return _models(config)
    if args.command == "check":
        return _check(config)
    return _serve(config)


def _serve(config: ServeConfig) -> int:
    from edge_runtime.api import access_log, request_ids
    from edge_runtime.api.app import create_app
    from edge_runtime.api.auth import KeyFileError

    if (config.tls_cert is None) != (config.tls_key is None):
        print("error: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    request_ids.install_log_filter()
    access_log.configure(config.access_log)
    try:
        app = create_app(config)
    except KeyFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if config.metrics_require_key and not app.ctx.keys.enabled:
        print("error: --metrics-require-key needs an API key (--api-key-file or EDGE_RUNTIME_API_KEY)",
              file=sys.stderr)
        return 2
    ssl = None if config.tls_cert is None else {"cert": str(config.tls_cert), "key": str(config.tls_key)}
    # Until the server installs its handler (after it starts listening), a SIGHUP must not end it:
    # its default action would. The handler then re-reads keys and models.yaml.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    app.run(host=config.host, port=config.port, single_process=True, access_log=False, motd=False, ssl=ssl)
    return 0
