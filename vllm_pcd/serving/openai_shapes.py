"""OpenAI's chat shapes, in and out: a request's messages as the text turns PCD reads, and
PCD's answer as a chat completion with its diagnostics beside it."""

from __future__ import annotations

import time
from typing import Any

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

from vllm_pcd.core.schema import SchemaError, shown


def plain_messages(request: ChatCompletionRequest) -> list[dict[str, str]]:
    """OpenAI messages → role/content strings; only text content is meaningful to PCD."""
    messages = []
    for i, message in enumerate(request.messages):
        message = dict(message)
        content = message.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                part = dict(part)
                if part.get("type") != "text" or not isinstance(part.get("text", ""), str):
                    raise SchemaError(f"messages[{i}]: only text content is supported with "
                                      f"pcd_schema, got {shown(part.get('type'))}",
                                      param=f"messages[{i}].content", rule="content")
                parts.append(part.get("text", ""))
            content = "\n".join(parts)
        if not isinstance(content, str):
            raise SchemaError(f"messages[{i}]: content must be text", param=f"messages[{i}]",
                              rule="content")
        messages.append({"role": str(message.get("role")), "content": content})
    return messages


def completion(request_id: str, model: str, content: str, diagnostics: dict[str, Any],
               decisions: int) -> dict[str, Any]:
    """An OpenAI chat completion carrying the object, with PCD's diagnostics beside it."""
    prompt_tokens = diagnostics["tokens"]["ideal"]
    usage: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": decisions,
                             "total_tokens": prompt_tokens + decisions}
    if "computed" in diagnostics["tokens"]:  # cache hits revealed on this server
        usage["prompt_tokens_details"] = {
            "cached_tokens": prompt_tokens - min(prompt_tokens, diagnostics["tokens"]["computed"])}
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "logprobs": None,
            "finish_reason": "stop",
        }],
        "usage": usage,
        "pcd": diagnostics,
    }
