"""`edge-runtime serve | models | check | devices | examples` (also `python -m edge_runtime ...`).

``serve`` takes our own command line (``--models models.yaml``) and the Router's managed one, which
is upstream ``vllm-srun serve``'s: ``serve --models F.models.json --uds S.sock --max-request-bytes N
--max-bundle-tasks N [--cache-dir D] [--threads N]``, or ``serve MODEL[@REVISION] ...``. A flag of
upstream's that this runtime cannot honour is refused with the reason, never ignored.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

# Nothing here imports numpy before main() has read --threads: numpy's BLAS sizes its pool once, at import.
from edge_runtime import config as cfg
from edge_runtime.config import ConfigError, EntryDefaults, ServeConfig

#: Flags of upstream's ``vllm-srun serve`` that this runtime refuses, and why.
REFUSED_FLAGS: dict[str, str] = {
    "--family": "a model's family is read from its package card (a converter records it)",
    "--max-queued-tokens": "queues are bounded in jobs (--max-queue) and each forward in tokens "
                           "(--max-batch-tokens), not in queued tokens",
    "--batch-window-ms": "rows are batched as soon as the model is free, without a waiting window "
                         "(profile batching shares padded batches)",
    "--base-path": "adapters are merged with their base when converted (python -m converters export)",
    "--accept-licence": "models are not gated by licence here: edge-runtime serves the packages it is given",
    "--autotune-cache": "there is no kernel autotuning to record: ONNX Runtime's CPU kernels are fixed, and "
                        "CUDA's algorithm search is in each model's engine_args",
}
LOG_LEVELS = ("debug", "info", "warning", "error")
#: Environment variables that size the math libraries' own thread pools (numpy's BLAS, OpenMP): one
#: thread each unless the environment says otherwise. The heads' numpy matmuls are small (a 768-wide
#: classifier: well under a millisecond on one thread), while a BLAS pool's threads spin after every
#: call on the cores the models' ONNX Runtime threads need: a Vela 1.0 specialist's int8 forward took
#: 60-100 ms served against 31 ms in-process until BLAS ran on one thread (docs/benchmarks.md).
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


class _Refused(argparse.Action):
    """Any use of the flag is an error that says why."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> NoReturn:
        parser.error(f"{option_string}: edge-runtime cannot honour it: {REFUSED_FLAGS[str(option_string)]}")


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _whole(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, not {value}")
    return value


def _device(text: str) -> str:
    try:
        return cfg.check_device(text, "--device")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return value


def _add_model_arguments(p: argparse.ArgumentParser) -> None:
    """Which models: a models file, or MODEL arguments (the Router's artifacts), and their defaults."""
    p.add_argument("model", nargs="*", metavar="MODEL[@REVISION]",
                   help="a package directory, a directory a converter reads, or a repo id in the Hugging Face "
                        "cache (--cache-dir); several share one process. Without MODEL or --models: models.yaml")
    p.add_argument("--models", type=Path, default=None,
                   help="models file: ours (package entries) or the Router's (model entries), as YAML or JSON")
    p.add_argument("--revision", help="the revision of one MODEL (a commit, branch or tag of its cache entry)")
    p.add_argument("--served-model-name", help="the name one MODEL is served as (default: its last path part)")
    p.add_argument("--device", type=_device, default="auto",
                   help="MODEL arguments: cpu, cuda, cuda:N or auto (default: auto)")
    p.add_argument("--profile", choices=tuple(cfg.PROFILES), default="exact",
                   help="MODEL arguments: numerics profile (docs/deployment.md has the table; default: exact)")
    p.add_argument("--engine", default="auto", help="auto or onnxruntime: the engine this runtime is")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="Hugging Face cache where repo ids resolve, offline; conversions are kept beside them "
                        "(default: HF_HUB_CACHE, else ~/.cache/huggingface/hub)")
    p.add_argument("--offline", action="store_true",
                   help="use only local files: always the case here (nothing is ever downloaded)")
    p.add_argument("--threads", type=_at_least_one, default=None,
                   help="the process's share of the cores: no model's sessions use more intra-op threads, and "
                        "the preparation pool and math libraries are sized by it")
    p.add_argument("--max-queue", type=_at_least_one, default=cfg.DEFAULT_MAX_QUEUE,
                   help="jobs a model queues before 429, for models whose entry sets no max_queue")
    p.add_argument("--max-batch-tokens", type=_at_least_one, default=cfg.DEFAULT_MAX_BATCH_TOKENS,
                   help="padded tokens one forward may hold")
    p.add_argument("--memory-budget", type=float, default=None, metavar="GIB",
                   help="refuse to load a model estimated above this many GiB")
    p.add_argument("--result-cache-entries", type=_whole, default=cfg.DEFAULT_RESULT_CACHE_ENTRIES,
                   help="row results each model keeps by content (0: no cache)")
    p.add_argument("--result-cache-bytes", type=_whole, default=cfg.DEFAULT_RESULT_CACHE_BYTES,
                   help="bytes of row results each model keeps at most")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edge-runtime", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("serve", "serve models over HTTP (TCP, or a Unix socket with --uds)"),
        ("models", "list what would be served"),
        ("check", "load and self-check every model, then exit 0 (all ready) or 1"),
    ):
        p = sub.add_parser(name, help=text)
        _add_model_arguments(p)
        p.add_argument("--host", default=cfg.DEFAULT_HOST)
        p.add_argument("--port", type=int, default=cfg.DEFAULT_PORT)
        p.add_argument("--max-request-bytes", type=int, default=cfg.DEFAULT_MAX_REQUEST_BYTES)
        p.add_argument("--forward-timeout-seconds", type=float, default=cfg.DEFAULT_FORWARD_TIMEOUT_SECONDS)
        p.add_argument("--systemone-schema", choices=cfg.SYSTEMONE_SCHEMAS, default="vllm-sr/5.0")
        p.add_argument("--max-bundle-tasks", type=int, default=cfg.DEFAULT_MAX_BUNDLE_TASKS)
        p.add_argument("--drain-seconds", type=float, default=None,
                       help="on SIGTERM/SIGINT, how long accepted requests may take before queued work gets 503 "
                            f"(default {cfg.DEFAULT_DRAIN_SECONDS:g}; {cfg.DEFAULT_MANAGED_DRAIN_SECONDS:g} with "
                            "--uds, inside the Router's 10 s grace)")
        p.add_argument("--max-prep-queue", type=_at_least_one, default=cfg.DEFAULT_MAX_PREP_QUEUE,
                       help="jobs that may wait for a preparation thread (body decoding and parsing, tokenizing, "
                            "media) before a request is refused overloaded (429)")
        p.add_argument("--load-attempts", type=_at_least_one, default=cfg.DEFAULT_LOAD_ATTEMPTS,
                       help="loads of a model before it stays failed; package, artifact and self-check failures "
                            "are never retried")
        p.add_argument("--load-retry-seconds", type=_positive_seconds, default=cfg.DEFAULT_LOAD_RETRY_SECONDS,
                       help=f"wait before the first reload of a model that failed to load, doubling up to "
                            f"{cfg.MAX_LOAD_RETRY_SECONDS:g} s")
    serve = sub.choices["serve"]
    serve.add_argument("--uds", type=Path, default=None,
                       help="serve on this Unix domain socket instead of TCP (its directory is made 0700 when "
                            "missing; a stale socket is replaced)")
    serve.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    for flag in REFUSED_FLAGS:
        serve.add_argument(flag, action=_Refused, nargs="?", help=argparse.SUPPRESS)
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
    sub.add_parser("devices", help="print, as JSON, this host's devices and the one device auto takes")
    ex = sub.add_parser("examples", help="send the contract's Decisions examples to a server and check the answers")
    ex.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8100")
    ex.add_argument("--model", required=True, help="the decision model to ask (replaces the examples' model)")
    return parser


def _serve_config(args: argparse.Namespace) -> ServeConfig:
    from edge_runtime.models_file import ENGINES, command_line_models, load_models_file

    if args.engine not in ENGINES:
        raise ConfigError(f"--engine {args.engine!r} is not served here: edge-runtime runs ONNX Runtime "
                          f"(engine {' or '.join(ENGINES)})")
    defaults = EntryDefaults(
        threads_cap=args.threads,
        max_queue=args.max_queue,
        max_batch_tokens=args.max_batch_tokens,
        result_cache_entries=args.result_cache_entries,
        result_cache_bytes=args.result_cache_bytes,
        memory_budget_bytes=int(args.memory_budget * 2**30) if args.memory_budget is not None else None,
        cache_dir=args.cache_dir if args.cache_dir is not None else cfg.default_cache_dir(),
    )
    models_file: Path | None = args.models
    if args.model:
        if models_file is not None:
            raise ConfigError("give MODEL arguments or --models, not both")
        models = command_line_models(args.model, defaults, revision=args.revision, name=args.served_model_name,
                                     device=args.device, profile=args.profile)
    else:
        if args.revision or args.served_model_name:
            raise ConfigError("--revision and --served-model-name apply to one MODEL argument")
        models_file = models_file or Path("models.yaml")
        models = load_models_file(models_file, defaults)
    uds = getattr(args, "uds", None)
    drain = args.drain_seconds if args.drain_seconds is not None else (
        cfg.DEFAULT_MANAGED_DRAIN_SECONDS if uds is not None else cfg.DEFAULT_DRAIN_SECONDS)
    return ServeConfig(
        models_file=models_file,
        models=models,
        host=args.host,
        port=args.port,
        uds=uds,
        defaults=defaults,
        threads=args.threads,
        load_attempts=args.load_attempts,
        load_retry_seconds=args.load_retry_seconds,
        max_request_bytes=args.max_request_bytes,
        forward_timeout_seconds=args.forward_timeout_seconds,
        systemone_schema=args.systemone_schema,
        max_bundle_tasks=args.max_bundle_tasks,
        drain_seconds=drain,
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


def _models(config: ServeConfig) -> int:
    from edge_runtime.families.registry import read_package
    from edge_runtime.packages import PackageError

    for m in config.models:
        if m.missing is not None:
            what = f"not found: {m.missing}"
        elif m.source is not None:
            what = f"source {m.source}, converted into the package when it loads"
        else:
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


def _devices() -> int:
    from edge_runtime.engine.devices import report

    print(json.dumps(report(), indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = _parser().parse_args(argv)
    if args.command == "examples":
        from edge_runtime.examples import main as examples

        return examples(args.url, args.model)
    if args.command == "devices":
        return _devices()
    for name in THREAD_ENV:  # before numpy loads its BLAS: it sizes its pool once
        os.environ.setdefault(name, "1")
    level = getattr(args, "log_level", "info").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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
    from edge_runtime.api.unix_socket import SocketError, bind_unix_socket

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
    if config.uds is None:
        app.run(host=config.host, port=config.port, single_process=True, access_log=False, motd=False, ssl=ssl)
        return 0
    try:
        listener = bind_unix_socket(config.uds)
    except SocketError as exc:
        print(f"error: --uds {config.uds}: {exc}", file=sys.stderr)
        return 2
    try:
        app.run(sock=listener.sock, single_process=True, access_log=False, motd=False, ssl=ssl)
    finally:
        listener.remove()
    return 0
