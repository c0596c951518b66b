"""The API server refuses client `vllm_xargs` that would speak on PCD's engine channel.

vLLM copies a request's `vllm_xargs` into `SamplingParams.extra_args` on every route (chat,
completions, responses, ...), the dict PCD's engine-side patches read. The engine core
rejects anything there it did not sign (`internals.tags`); this ASGI middleware answers such
a request with a 400 naming the key before it reaches a handler, on every route. Only JSON
POST bodies that mention `pcd` at all are parsed.
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

RESERVED_PREFIX = "pcd"

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def reserved_xargs_key(body: bytes) -> str | None:
    """The first `vllm_xargs` key of a JSON body that PCD reserves, if any."""
    if RESERVED_PREFIX.encode() not in body.lower():
        return None
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):
        return None  # not JSON: vLLM's own handler refuses it
    xargs = request.get("vllm_xargs") if isinstance(request, dict) else None
    if not isinstance(xargs, dict):
        return None
    return next((k for k in xargs if k.lower().startswith(RESERVED_PREFIX)), None)


def refusal(key: str) -> bytes:
    message = (f"vllm_xargs key {key[:40]!r} is reserved for vllm-pcd's engine channel; "
               "PCD options go in chat_template_kwargs")
    return json.dumps({"error": {"message": message, "type": "BadRequestError",
                                 "param": "vllm_xargs", "code": 400}}).encode()


class ReservedXargsGuard:
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
        key = reserved_xargs_key(b"".join(chunks))
        if key is not None:
            body = refusal(key)
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return None

        async def replay() -> dict[str, Any]:
            return messages.pop(0) if messages else await receive()

        return await self.app(scope, replay, send)
