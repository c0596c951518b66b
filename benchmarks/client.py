"""One OpenAI-compatible server as every benchmark method sees it: the client, the task a
method answers, and what a call gave."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

from vllm_pcd.core.plan import DEFAULT_LAYOUT, Options, Plan, build_plan
from vllm_pcd.core.schema import SchemaSpec, parse_schema


class Unsupported(Exception):
    """The server cannot run this method; reported, never fatal."""


@dataclass(frozen=True)
class Task:
    """One question set: the conversation, the schema, and the token plan PCD computes."""

    messages: list[dict[str, Any]]
    schema: dict[str, Any]
    spec: SchemaSpec
    plan: Plan
    layout: str = DEFAULT_LAYOUT  # where every method puts the field list
    tokenizer: Any = field(default=None, repr=False)  # for methods that write their own prompt


def make_task(tokenizer: Any, schema: dict[str, Any], messages: list[dict[str, Any]],
              layout: str = DEFAULT_LAYOUT) -> Task:
    spec = parse_schema(schema)
    return Task(messages, schema, spec, build_plan(tokenizer, spec, messages,
                                                   Options(layout=layout)),
                layout, tokenizer)


def load_tokenizer(model: str | Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model))


@dataclass
class Outcome:
    """What one call of one method gave. `None` means not observable from the client."""

    status: str  # "ok", "unsupported: …" or "error: …"
    object: dict[str, Any] | None = None
    latency_s: float | None = None
    tokens_computed: int | None = None
    backbone_calls: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class Client:
    """One OpenAI-compatible server: the async client plus the served model's name."""

    def __init__(self, url: str, timeout_s: float = 600):
        self.api = openai.AsyncOpenAI(base_url=url.rstrip("/") + "/v1",
                                      api_key=os.environ.get("OPENAI_API_KEY", "EMPTY"),
                                      max_retries=0, timeout=timeout_s)
        self.model: str | None = None

    async def connect(self) -> "Client":
        self.model = (await self.api.models.list()).data[0].id
        return self

    async def close(self) -> None:
        await self.api.close()


def computed(usage: Any) -> int | None:
    """Prompt tokens the engine did not find in its prefix cache (needs
    --enable-prompt-tokens-details; None when the server does not report them)."""
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None)
    return None if cached is None else usage.prompt_tokens - cached


def error_text(err: openai.APIStatusError) -> str:
    body = err.body if isinstance(err.body, dict) else {}
    body = body.get("error", body) if isinstance(body.get("error"), dict) else body
    return f"HTTP {err.status_code}: {body.get('message') or err.message}"


async def complete(client: Client, ids: list[int], salt: str,
                    extra_body: dict[str, Any] | None = None, **options: Any) -> Any:
    """One token after a token-id prompt: the completions API applies no chat template."""
    return await client.api.completions.create(
        model=client.model, prompt=ids, max_tokens=1, temperature=0,
        extra_body={"cache_salt": salt, **(extra_body or {})}, **options)
