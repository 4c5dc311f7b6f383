"""``--server URL``: the read commands and the operator commands go through the HTTP API
instead of the state database. The token comes from ``--token-file`` or
``TRAINGUARD_TOKEN``; the server from ``--server`` or ``TRAINGUARD_SERVER``.

:func:`operations` gives an operator command its
:class:`~trainguard.controller.operations.Operations`: remote with ``--server``, else
local on ``--state`` (the same control-plane code the API runs), so a command has
one code path and the same effects either way (decision 0230).
"""

from __future__ import annotations

import argparse
import getpass
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainguard.controller.operations import Operations

SERVER_ENV = "TRAINGUARD_SERVER"


class RemoteError(Exception):
    """A request through the API failed; the message is ready to print."""


class NoDatabase(RemoteError):
    """``--state`` names no database: nothing was recorded there yet."""


def add_server_option(parser: argparse.ArgumentParser, *, sub: bool = False) -> None:
    """``--server`` and ``--token-file``; ``sub=True`` for sub-commands (SUPPRESS defaults,
    so an option given before the sub-command is not overwritten)."""
    default: Any = argparse.SUPPRESS if sub else os.environ.get(SERVER_ENV) or None
    parser.add_argument(
        "--server",
        default=default,
        metavar="URL",
        help=f"read through this control plane's API (default: ${SERVER_ENV}) instead of --state",
    )
    parser.add_argument(
        "--token-file",
        default=argparse.SUPPRESS if sub else None,
        metavar="FILE",
        help="token for --server (default: $TRAINGUARD_TOKEN)",
    )


def default_actor() -> str:
    """``operator:<user name>``: who acts on a local state database."""
    try:
        return f"operator:{getpass.getuser()}"
    except Exception:  # no user name in this environment (containers)
        return "operator"


@contextmanager
def operations(args: argparse.Namespace, actor: str | None = None) -> Iterator[Operations]:
    """The operations interface the command's options name: ``--server`` (the actor is
    the token's holder) or ``--state`` (acting as ``actor``, default
    ``operator:<user>``). A missing database or token raises :class:`RemoteError`."""
    if getattr(args, "server", None):
        from trainguard.api.client import RemoteOperations

        client = _client(args)
        try:
            yield RemoteOperations(client)
        finally:
            client.close()
        return
    from trainguard.controller.operations import LocalOperations
    from trainguard.controller.service import ControlPlane
    from trainguard.store import Store, StoreError

    try:
        store = Store.open_existing(args.state)
    except StoreError as exc:
        raise RemoteError(str(exc)) from exc
    if store is None:
        raise NoDatabase(f"no state database at {args.state}")
    with store:
        control = ControlPlane(store, None)
        try:
            yield LocalOperations(control, actor or default_actor())
        finally:
            control.close()


def _client(args: argparse.Namespace) -> Any:
    from trainguard.api.auth import TokenFileError
    from trainguard.api.client import ApiClient, resolve_token

    try:
        token = resolve_token(getattr(args, "token_file", None))
    except TokenFileError as exc:
        raise RemoteError(str(exc)) from exc
    return ApiClient(args.server, token)


def _call(args: argparse.Namespace, method: str, path: str, **kwargs: Any) -> Any:
    from trainguard.api.client import ApiError

    client = _client(args)
    try:
        return getattr(client, method)(path, **kwargs)
    except ApiError as exc:
        raise RemoteError(str(exc)) from exc
    finally:
        client.close()


def get_json(args: argparse.Namespace, path: str, **params: Any) -> Any:
    return _call(args, "get", path, **params)


def audit(args: argparse.Namespace, limit: int | None, **filters: Any) -> list[dict[str, Any]]:
    """Audit records oldest first; ``limit`` keeps the most recent N (as the CLI does)."""
    from trainguard.api.client import ApiError

    client = _client(args)
    try:
        if limit is not None and limit <= 1000:
            page = client.get("/v1/audit", order="newest", limit=max(1, limit), **filters)
            return list(page["events"]) if limit > 0 else []
        events: list[dict[str, Any]] = client.audit_all(**filters)
        return events if limit is None else events[len(events) - limit :]
    except ApiError as exc:
        raise RemoteError(str(exc)) from exc
    finally:
        client.close()


__all__ = [
    "SERVER_ENV",
    "NoDatabase",
    "RemoteError",
    "add_server_option",
    "audit",
    "default_actor",
    "get_json",
    "operations",
]
