"""Strict JSON request bodies: refuse what ``json.loads`` lets through but nothing can keep.

Python's parser accepts things that are not JSON or not storable, and each used
to surface as a 500 somewhere later (issues 14 and 25):

* ``NaN``, ``Infinity`` and ``-Infinity`` literals (not JSON numbers; they poison
  rates and comparisons, and a store or a client may reject them on the way out),
  and numbers too large for a float (``1e400`` parses to infinity: the response
  could not be written and the kept-alive connection was reset);
* a lone UTF-16 surrogate escape (``"\\ud800"``): a Python string that cannot be
  encoded as UTF-8, so the store write or the response fails;
* deep nesting: 100,000 brackets make the parser raise ``RecursionError``, and a
  few hundred make any later recursive walk (validation errors, ``json.dumps``) do so.

:func:`parse` refuses all of them with a :class:`BadJson` message; :class:`StrictJson`
(ASGI middleware) applies it to every request body before the fast lane and the
framework see it, and answers 422 in the framework's validation-error shape, so the
response matches the published schema. Malformed JSON is left to the framework, whose
message names the position.
"""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trainguard.api.metrics import Metrics

MAX_DEPTH = 64  # containers inside containers; the deepest request schema needs ~40
PARSED = "trainguard.json"  # scope key: the body already parsed (the fast lane reuses it)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class BadJson(ValueError):
    """A body that is JSON text but not acceptable input; ``str()`` says why."""


class Malformed(ValueError):
    """Not JSON at all (left to the framework, whose message names the position)."""


def _no_constant(name: str) -> Any:
    raise BadJson(f"{name} is not a JSON number (numbers must be finite)")


def _finite(text: str) -> float:
    value = float(text)
    if value - value != 0.0:  # inf - inf is nan: only infinities get here
        raise BadJson(f"{text[:40]} is out of range for a JSON number (numbers must be finite)")
    return value


_HOOKS: dict[str, Any] = {"parse_constant": _no_constant, "parse_float": _finite}
_DECODER = json.JSONDecoder(**_HOOKS)  # one decoder: json.loads(**hooks) builds one per call


def depth_ok(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests at most ``limit`` containers deep (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)] if type(value) in (dict, list) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return False
        children = item.values() if type(item) is dict else item
        stack.extend((c, depth + 1) for c in children if type(c) is dict or type(c) is list)
    return True


def _encodable(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is str:
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return False
        elif type(item) is dict:
            stack.extend(item.keys())
            stack.extend(item.values())
        elif type(item) is list:
            stack.extend(item)
    return True


def _load(body: bytes) -> Any:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return json.loads(body, **_HOOKS)  # UTF-16/32: json.loads detects the encoding
    return _DECODER.decode(text)


def parse(body: bytes) -> Any:
    """The JSON value of ``body``; :class:`BadJson` for the refused cases, :class:`Malformed`
    for text that is not JSON."""
    try:
        data = _load(body)
    except BadJson:
        raise
    except RecursionError:
        raise BadJson(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise Malformed(str(exc)) from None
    except ValueError as exc:  # an integer of more than 4300 digits; UnicodeDecodeError
        if "digits" in str(exc):
            raise BadJson("an integer is out of range for a JSON number") from None
        raise Malformed(str(exc)) from None
    # Cheap tests first: nesting needs at least MAX_DEPTH opening brackets, a lone
    # surrogate needs a \uD8xx-\uDFxx escape in the text.
    if (
        type(data) in (dict, list)
        and body.count(b"[") + body.count(b"{") > MAX_DEPTH
        and not depth_ok(data)
    ):
        raise BadJson(f"JSON nested deeper than {MAX_DEPTH} levels")
    if _SURROGATE_ESCAPE.search(body) and not _encodable(data):
        raise BadJson("a string holds a lone UTF-16 surrogate (not valid Unicode text)")
    return data


def validation_error(message: str, loc: tuple[str | int, ...] = ("body",)) -> dict[str, Any]:
    """A 422 body in the framework's ``HTTPValidationError`` shape (the published schema)."""
    return {"detail": [{"type": "json_invalid", "loc": list(loc), "msg": message}]}


def _is_json(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
            return media == b"application/json" or media.endswith(b"+json")
    return True  # no content type: the framework parses the body as JSON


class StrictJson:
    """Refuse a JSON request body :func:`parse` refuses, with 422 and the reason."""

    def __init__(self, app: ASGIApp, metrics: Metrics | None = None) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope.get("method") not in _BODY_METHODS
            or not _is_json(scope)
        ):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:  # BodyLimit, outside this, has bounded the size
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if body:
            try:
                scope[PARSED] = parse(body)
            except BadJson as exc:
                if self.metrics is not None:
                    self.metrics.rejected.labels("invalid").inc()
                data = json.dumps(validation_error(str(exc))).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 422,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": data})
                return
            except Malformed:
                pass  # the framework answers with the position of the error
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


__all__ = ["MAX_DEPTH", "PARSED", "BadJson", "Malformed", "StrictJson", "parse"]
