"""The API server refuses, on every route, request bodies that would reach what a client
must not touch, with a 400 naming the part, before vLLM's handlers see them:
- `vllm_xargs` keys PCD reserves. This is the early answer for plain JSON bodies; the check
  that sees every form (escaped keys, UTF-16, multipart, token-in routes) is vLLM's input
  validation (`internals.validation`);
- a `structured_outputs` that is not an object: vLLM 0.32's request validators call `.get`
  on it and answer a 500 (found by tests/server/test_hostile.py).
Only POST bodies that spell either key are parsed, so an ordinary body (images included)
costs one byte search. A refusal PCD raises inside vLLM's code (`internals.errors.client_error`)
that a route lets escape is answered here with the same 400.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from typing import Any, Awaitable, Callable

RESERVED_PREFIX = "pcd"

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def refused_part(body: bytes) -> tuple[str, str] | None:
    """(param, message) for a JSON body this guard refuses; None for every other body."""
    if b"vllm_xargs" not in body and b"structured_outputs" not in body:
        return None
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):
        return None  # not JSON: vLLM's own handler refuses it
    if not isinstance(request, dict):
        return None
    xargs = request.get("vllm_xargs")
    if isinstance(xargs, dict):
        key = next((k for k in xargs if k.lower().startswith(RESERVED_PREFIX)), None)
        if key is not None:
            return "vllm_xargs", (f"vllm_xargs key {key[:40]!r} is reserved for vllm-pcd's "
                                  "engine channel; PCD options go in chat_template_kwargs")
    structured = request.get("structured_outputs")
    if structured is not None and not isinstance(structured, dict):
        return "structured_outputs", (f"structured_outputs must be an object, got "
                                      f"{type(structured).__name__}")
    return None


def refusal(param: str, message: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": "BadRequestError",
                                 "param": param, "code": 400}}).encode()


async def _answer_400(send: Send, body: bytes) -> None:
    await send({"type": "http.response.start", "status": 400,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class RequestGuard:
    """Pure ASGI middleware (the body is read once and replayed to the app unchanged)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        messages, chunks = [], []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        refused = refused_part(b"".join(chunks))
        if refused is not None:
            return await _answer_400(send, refusal(*refused))

        async def replay() -> dict[str, Any]:
            return messages.pop(0) if messages else await receive()

        started = False

        async def tracked(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            return await self.app(scope, replay, tracked)
        except Exception as err:
            # A refusal PCD raised inside vLLM's code that the route did not answer itself.
            refused = getattr(err, "pcd_refusal", None)
            if refused is None or started:
                raise
        return await _answer_400(send, refusal(*refused))


class ApiKeys:
    """The server's API keys (`--api-key`, else `VLLM_API_KEY`), checked as vLLM's own
    middleware checks them. vLLM guards only its `/v1`-style paths, so SageMaker's
    `/invocations` answers without a key; PCD's answers there must not: a PCD body needs the
    key on every door."""

    def __init__(self, args: Any) -> None:
        keys = getattr(args, "api_key", None) or [os.environ.get("VLLM_API_KEY")]
        keys = [keys] if isinstance(keys, str) else keys
        self._hashes = [hashlib.sha256(k.encode("utf-8")).digest() for k in keys if k]

    @staticmethod
    def _presented(raw_request: Any) -> bytes | None:
        """The digest of the bearer token the HTTP request presents, if it presents one."""
        scheme, _, token = ((raw_request.headers.get("Authorization") or "")
                            if raw_request is not None else "").partition(" ")
        return hashlib.sha256(token.encode("utf-8")).digest() \
            if scheme.lower() == "bearer" else None

    def _matches(self, digest: bytes | None) -> list[bool]:
        """Per server key, whether `digest` is it (every key compared, in constant time)."""
        return [digest is not None and secrets.compare_digest(digest, known)
                for known in self._hashes]

    def tenant(self, raw_request: Any, user: Any = None) -> str:
        """Whose running estimates a call reads and feeds: which of the server's keys it
        presented (its position, never the key) and the OpenAI `user` it names, so callers
        behind different keys, or different end users behind one gateway, never share one."""
        matches = self._matches(self._presented(raw_request))
        key = str(matches.index(True)) if True in matches else "-"
        return f"{key}/{user if isinstance(user, str) else ''}"

    def admit(self, raw_request: Any) -> bool:
        """Whether the HTTP request (None: no HTTP, as in `vllm run-batch`) may be answered."""
        if not self._hashes or raw_request is None:
            return True
        return any(self._matches(self._presented(raw_request)))
