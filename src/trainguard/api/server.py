"""Run the control plane in one process: API, dashboard, /metrics and the controller loop.

:func:`serve` opens the store, loads (or creates) the token file, builds the
controller (the ``ControlPlane`` facade) and the API around it, runs the
reconcile loop in a thread, and serves HTTP with uvicorn (uvloop and httptools
when installed) on a socket it binds itself, so ``--port 0`` works and the real
address is printed before the first request can arrive.

Transport and files (issues 14 and 25): ``--tls-cert``/``--tls-key`` serve HTTPS
with uvicorn's own TLS; plain HTTP on an address other than loopback is refused
(tokens would cross the network in clear text) unless ``--insecure-bind`` says it
is meant, and then warned about; on such an address serve also says, at start,
what anyone who can reach it reads without a token (``/metrics`` always, every
read route with ``--public-read``: :func:`exposure_notice`); an explicit SQLite
``--database`` in a directory that does not exist is refused rather than created;
a token file that others may read is warned about.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard.api.auth import ANY_HOST, TokenTable, create_token_file, token_file_warning
from trainguard.api.context import ApiContext, build_context
from trainguard.api.wiring import ServeOptions, build_control, load_scheduler, parse_nodes
from trainguard.controller.service import PassReport

log = logging.getLogger("trainguard.serve")


class ServeError(ValueError):
    """A serve option that cannot work; the message says which and why."""


def check_database(options: ServeOptions) -> None:
    """Refuse a SQLite database whose directory does not exist, unless it is the default.

    An explicit ``--database /srv/tg/state.db`` with a mistyped directory used to create
    the whole path (from ``/``, as root); only trainguard's own default directory
    (``.trainguard`` in the working directory) is created, and privately (0700).
    """
    db = options.database
    if db == ":memory:" or db.startswith(("postgresql://", "postgres://")):
        return
    parent = Path(db).parent
    if parent.is_dir():
        return
    if options.default_database:
        return  # Store.open creates it, 0700
    if parent.exists():
        raise ServeError(f"--database {db}: {parent} is not a directory")
    raise ServeError(
        f"--database {db}: the directory {parent} does not exist "
        "(create it first, or give another path)"
    )


def check_tls(options: ServeOptions) -> None:
    if (options.tls_cert is None) != (options.tls_key is None):
        raise ServeError("--tls-cert and --tls-key go together (a certificate and its key)")
    for flag, path in (("--tls-cert", options.tls_cert), ("--tls-key", options.tls_key)):
        if path is not None and not Path(path).is_file():
            raise ServeError(f"{flag} {path}: no such file")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def plain_http_warning(host: str) -> str:
    return (
        f"WARNING: serving plain HTTP on {host}, which is not a loopback address: bearer "
        "tokens and every report cross the network in clear text. Serve HTTPS with "
        "--tls-cert FILE --tls-key FILE, or bind 127.0.0.1 behind a TLS proxy."
    )


def check_bind(options: ServeOptions) -> None:
    """Refuse plain HTTP on a non-loopback address unless ``--insecure-bind`` says so."""
    if options.tls_cert is None and not is_loopback(options.host) and not options.insecure_bind:
        raise ServeError(
            f"--host {options.host} is not a loopback address and no --tls-cert/--tls-key "
            "is given: bearer tokens and every report would cross the network in clear "
            "text. Serve HTTPS (--tls-cert FILE --tls-key FILE), bind 127.0.0.1 behind a "
            "TLS proxy, or pass --insecure-bind to serve plain HTTP there anyway"
        )


# What a request without a token reads (keep in step with the routes and docs/api.md).
METRICS_EXPOSES = (
    "/metrics needs no token: it lists agent host names and GPU UUIDs (temperature, "
    "finding and XID counts per GPU), job ids (checkpoint age, last save, progress "
    "age), job, device, node and incident counts, and breaker states"
)
PUBLIC_READ_EXPOSES = (
    "--public-read: every read route answers without a token, as a viewer: jobs (ids, "
    "names, commands, scheduler ids, checkpoint directories, attempts, progress), nodes "
    "and devices (host names, GPU UUIDs, health states and history), incidents with "
    "their findings and log evidence, plans, actions, approvals, repairs, policies, "
    "modes, suppressions, the audit log, the fleet report and the dashboard"
)


def exposure_notice(host: str, port: int, public_read: bool) -> str | None:
    """What anyone who can reach ``host:port`` reads without a token; None on loopback
    (only local users can connect there)."""
    if is_loopback(host):
        return None
    reach = f"anyone who can reach {_url_host(host)}:{port or '<its port>'}"
    if public_read:
        return (
            f"WARNING: {reach} reads this control plane without a token. "
            f"{PUBLIC_READ_EXPOSES}. {METRICS_EXPOSES}. Without --public-read only "
            "/metrics, /healthz, the API schema (/v1/openapi.json, /v1/docs) and the "
            "dashboard's static files answer without a token."
        )
    return f"NOTE: {reach} can read /metrics: {METRICS_EXPOSES}."


def default_token_file(database: str) -> Path:
    if database.startswith(("postgresql://", "postgres://")):
        return Path(".trainguard/tokens.yaml")
    return Path(database).parent / "tokens.yaml"


def load_tokens(options: ServeOptions, say: Callable[[str], None]) -> tuple[TokenTable, str]:
    if options.token_file:
        path = Path(options.token_file)
    else:
        path = default_token_file(options.database)
        if not path.exists():
            create_token_file(path)
            say(
                f"created {path} with an operator and a viewer token (mode 0600); give each "
                "holder their token, and each host its own agent token: trainguard tokens add "
                f"--role agent --name HOST --token-file {path}"
            )
    table = TokenTable.load(path)
    if (warning := token_file_warning(path)) is not None:
        say(warning)
    if ANY_HOST in table.agent_hosts():
        say(
            f'note: {path} holds a fleet-proxy token (agent, name "*"): it reports for any '
            "host and posts any job's progress; per-host agent tokens and the jobs' own "
            "progress tokens need no such token (docs/api.md#authentication)"
        )
    return table, str(path)


class ReconcileLoop:
    """The controller loop in a thread of ``serve --loop thread``: the driver runtime
    (controller/runtime.py) over the control plane, each pass timed into the metrics.
    Its evidence comes in over HTTP (the routes record it as it arrives): it composes
    no polled source."""

    def __init__(self, ctx: ApiContext, interval: float) -> None:
        self.ctx = ctx
        self.interval = interval
        control = ctx.control
        assert control is not None
        self.runtime = control.driver(tick=interval, on_report=self._report, on_error=self._error)
        self._thread: threading.Thread | None = None

    @property
    def passes(self) -> int:
        return self.runtime.passes

    @property
    def errors(self) -> int:
        return self.runtime.errors

    def start(self) -> ReconcileLoop:
        self._thread = self.runtime.start_thread("reconcile")
        return self

    def stop(self) -> None:
        # The runtime gives the lease back as it stops: a standby takes over at once.
        self.runtime.stop()
        if self._thread is not None:
            self._thread.join(30.0)

    def _report(self, report: PassReport, elapsed: float) -> None:
        self.ctx.note_pass({"errors": list(report.errors)})
        for problem in report.errors:
            self.ctx.metrics.reconcile_errors.inc()
            log.warning("reconcile: %s", problem)
        self.ctx.metrics.reconcile_seconds.observe(elapsed)

    def _error(self, exc: Exception, elapsed: float) -> None:
        self.ctx.metrics.reconcile_errors.inc()
        log.error("reconcile pass failed", exc_info=exc)
        self.ctx.metrics.reconcile_seconds.observe(elapsed)


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(4096)
    sock.set_inheritable(True)
    return sock


def serve(options: ServeOptions, say: Callable[[str], None] = print) -> int:
    import uvicorn

    from trainguard.api.app import create_app
    from trainguard.store import open_store

    check_database(options)
    check_tls(options)
    check_bind(options)
    clock = time.time
    store = open_store(options.database, at=clock())
    tokens, token_path = load_tokens(options, say)
    if options.controller and options.holder is None:
        from trainguard.controller.lease import default_identity

        # One name for the loop (wherever it runs) and the API's view of leadership.
        options = dataclasses.replace(options, holder=default_identity())
    control = build_control(store, options, clock, load_scheduler(options.scheduler, options))
    # The progress flusher writes with a connection of its own (decision 0407): a flush
    # never holds the lock the API's reads take, and commits in short transactions.
    ingest_store = store if options.database == ":memory:" else open_store(options.database)
    ctx = build_context(
        store,
        tokens,
        control=control,
        clock=clock,
        mode=options.mode,
        database=_describe(options.database),
        public_read=options.public_read,
        max_body=options.max_body,
        heartbeat_interval=options.heartbeat_interval,
        ingest_store=ingest_store,
        max_ranks=options.max_ranks,
        pass_deadline_s=_lease_ttl(control) if control is not None else None,
    )
    app = create_app(ctx)
    if options.tls_cert is None and not is_loopback(options.host):
        say(plain_http_warning(options.host))  # before the bind: said even if it fails
    if (notice := exposure_notice(options.host, options.port, options.public_read)) is not None:
        say(notice)
    sock = bind(options.host, options.port)
    host, port = sock.getsockname()[:2]
    ctx.start()
    loop: ReconcileLoop | None = None
    child: Any = None
    ctx.loop_kind = options.loop
    if control is not None and options.loop == "thread":
        loop = ReconcileLoop(ctx, options.reconcile_interval).start()
    elif control is not None:
        from trainguard.api.loop_process import ControllerProcess

        child = ControllerProcess(options.to_json(), _loop_reporter(ctx)).start()
    config = uvicorn.Config(
        app,
        log_level=options.log_level,
        access_log=False,
        loop=_pick("uvloop", "auto"),
        http=_http_protocol(),
        timeout_keep_alive=75,  # agents keep one connection open between heartbeats
        backlog=4096,
        lifespan="off",
        proxy_headers=False,  # no proxy is trusted: the client address is the peer's
        server_header=False,
        ssl_certfile=options.tls_cert,
        ssl_keyfile=options.tls_key,
    )
    server = uvicorn.Server(config)
    scheme = "https" if options.tls_cert else "http"
    say(
        f"trainguard serve: listening on {scheme}://{_url_host(host)}:{port} "
        f"(mode {options.mode}, database {_describe(options.database)}, tokens {token_path})"
    )
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    try:
        server.run(sockets=[sock])
    finally:
        if loop is not None:
            loop.stop()
        if child is not None:
            child.stop()
        ctx.stop()
        if control is not None and hasattr(control, "close"):
            with contextlib.suppress(Exception):
                control.close()
        store.close()
        sock.close()
    return 0


def _loop_reporter(ctx: ApiContext) -> Callable[[dict[str, Any]], None]:
    """Turn the loop process's per-pass lines into metrics and the status page's view."""

    def report(line: dict[str, Any]) -> None:
        ctx.metrics.reconcile_seconds.observe(float(line.get("duration") or 0.0))
        errors = line.get("errors") or []
        if errors:
            ctx.metrics.reconcile_errors.inc(len(errors))
            for problem in errors:
                log.warning("reconcile: %s", problem)
        ctx.loop_status = line
        ctx.note_pass(line)

    return report


def _lease_ttl(control: Any) -> float:
    """The controller lease's ttl: how long ``/healthz`` waits for a completed pass."""
    from trainguard.controller.lease import DEFAULT_TTL_SECONDS

    return float(getattr(getattr(control, "config", None), "lease_ttl", DEFAULT_TTL_SECONDS))


def _http_protocol() -> Any:
    """httptools with a header deadline and a connection cap (api/http_guard.py), else
    uvicorn's own choice."""
    if _pick("httptools", "auto") == "auto":
        return "auto"
    from trainguard.api.http_guard import GuardedHttpTools, connection_cap, raise_fd_limit

    raise_fd_limit()
    GuardedHttpTools.max_connections = connection_cap()
    return GuardedHttpTools


def _pick(module: str, fallback: str) -> str:
    try:
        __import__(module)
    except ImportError:
        return fallback
    return module


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _describe(database: str) -> str:
    if database.startswith(("postgresql://", "postgres://")):
        _, _, tail = database.partition("@")
        return ("postgresql://***@" + tail) if tail else database.split("?")[0]
    return os.fspath(database)


__all__ = [
    "ReconcileLoop",
    "ServeError",
    "ServeOptions",
    "bind",
    "build_control",
    "check_bind",
    "check_database",
    "check_tls",
    "exposure_notice",
    "is_loopback",
    "load_scheduler",
    "parse_nodes",
    "serve",
]
