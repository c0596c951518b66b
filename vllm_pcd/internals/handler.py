"""PCD answers at vLLM's chat handler, so every door that reaches it answers the same.

`OpenAIServingChat.create_chat_completion` is what the HTTP route, SageMaker's
`/invocations`, `vllm run-batch`, and the chat-based routes built on it (Anthropic's
`/v1/messages`) call; `OpenAIServingResponses.create_responses` is the Responses API's
(`/v1/responses`; `/invocations` takes chat and completion bodies only). Wrapping it there, instead of replacing one HTTP route, gives all of
them PCD's answer for a body whose `chat_template_kwargs` carry a PCD key, as vLLM's own
response types (`ChatCompletionResponse`, or `ErrorResponse` with its status).

Every other door renders a chat through vLLM's own `ChatParams` and would drop `pcd_schema`
(HF templates keep only the variables they use) and answer free text. Building a
`ChatParams` that carries `pcd_schema` is refused instead, with vLLM's own validation error
(a 400 naming the doors that answer it).

Runs in: the API server process (and the process of an offline `LLM`).
Changes: `OpenAIServingChat.create_chat_completion`, `OpenAIServingResponses.create_responses`
  and `LLM.chat` answer PCD first; `ChatParams.__init__` refuses `pcd_schema`.
Remove when: vLLM lets a plugin answer a chat request before it is rendered, at every door.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Awaitable, Callable

from vllm_pcd.compat import require_methods
from vllm_pcd.internals.errors import client_error

CHAT_SERVING = "vllm.entrypoints.openai.chat_completion.serving"
RESPONSES_SERVING = "vllm.entrypoints.openai.responses.serving"
_HOOKS = ((CHAT_SERVING, "OpenAIServingChat", "create_chat_completion"),
          (RESPONSES_SERVING, "OpenAIServingResponses", "create_responses"))
SCHEMA_KEY = "pcd_schema"
STRAY_SCHEMA = ("chat_template_kwargs.pcd_schema is answered by vllm-pcd on /v1/chat/completions "
                "(also through /invocations and vllm run-batch) and on the offline "
                "vllm_pcd.constrained API; this entry point cannot carry it")

# (handler, request, HTTP request or None) -> (HTTP status, OpenAI body), or None: not PCD's.
Answer = Callable[[Any, Any, Any], Awaitable[tuple[int, dict[str, Any]] | None]]


def install_chat_hook(answer: Answer) -> None:
    """Idempotent: the last `answer` installed serves every handler of this process."""
    _install(CHAT_SERVING, "OpenAIServingChat", "create_chat_completion",
             "ChatCompletionResponse", answer)


def install_responses_hook(answer: Answer) -> None:
    """The Responses API's handler (`/v1/responses`), as `install_chat_hook`."""
    _install(RESPONSES_SERVING, "OpenAIServingResponses", "create_responses",
             "ResponsesResponse", answer)


def require_hooks() -> None:
    """Check (and record as patch targets) every handler a door answers at, without
    installing anything; their modules are imported only where this or an install runs."""
    from vllm.entrypoints.llm import LLM

    require_methods(LLM, "chat", patch="handler")
    for module_name, class_name, method in _HOOKS:
        module = sys.modules.get(module_name) or __import__(module_name, fromlist=["_"])
        require_methods(getattr(module, class_name), method, patch="handler")


def _install(module_name: str, class_name: str, method: str, response_type: str,
             answer: Answer) -> None:
    module = sys.modules.get(module_name) or __import__(module_name, fromlist=["_"])
    handler_cls = getattr(module, class_name)
    require_methods(handler_cls, method, patch="handler")
    stock = getattr(getattr(handler_cls, method), "__pcd_stock__", getattr(handler_cls, method))

    @functools.wraps(stock)
    async def answered_first(self: Any, request: Any, raw_request: Any = None) -> Any:
        answered = await answer(self, request, raw_request)
        if answered is None:
            return await stock(self, request, raw_request)
        status, body = answered
        if status >= 400:
            return module.ErrorResponse.model_validate(body)
        return getattr(module, response_type).model_validate(body)

    answered_first.__pcd_stock__ = stock
    setattr(handler_cls, method, answered_first)


def install_offline_chat_hook(answer: Callable[[Any, dict[str, Any]], Any]) -> None:
    """`LLM.chat` asks `answer(llm, arguments)` first (its arguments by name, defaults
    filled): a list of `RequestOutput`s, or None for vLLM's own generation."""
    import inspect

    from vllm.entrypoints.llm import LLM

    require_methods(LLM, "chat", patch="handler")
    stock = getattr(LLM.chat, "__pcd_stock__", LLM.chat)
    signature = inspect.signature(stock)

    @functools.wraps(stock)
    def chat(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        arguments.pop("self")
        answered = answer(self, arguments)
        return stock(self, *args, **kwargs) if answered is None else answered

    chat.__pcd_stock__ = stock
    LLM.chat = chat


def refuse_stray_schema() -> None:
    """Every chat vLLM renders itself is checked as its parameters are built."""
    from vllm.renderers.params import ChatParams

    require_methods(ChatParams, "__init__", patch="handler")
    init = getattr(ChatParams.__init__, "__pcd_stock__", ChatParams.__init__)

    @functools.wraps(init)
    def checked_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        carried = self.chat_template_kwargs
        if isinstance(carried, dict) and SCHEMA_KEY in carried:
            raise client_error(STRAY_SCHEMA, f"chat_template_kwargs.{SCHEMA_KEY}")

    checked_init.__pcd_stock__ = init
    ChatParams.__init__ = checked_init
