"""PCD's per-server state and the one call every route makes (`PCDService.run`).

The work before the engine (template, tokenizer passes) runs off the event loop, on a
tokenizer of its own; the call is bounded in time, and whatever fails is answered with the
status it deserves (`errors`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import time
from http import HTTPStatus
from typing import Any

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.logger import init_logger

from vllm_pcd.core.scoring import RunningPriors
from vllm_pcd.core.plan import KEYS, Options, check_conversation
from vllm_pcd.core.result import PCDResult
from vllm_pcd.core.schema import Limits, SchemaError, SchemaSpec, shown
from vllm_pcd.internals.lm_head import configured_route
from vllm_pcd.pipeline import PLANNER, Call, Online, Overloaded, answer_online, profiles_of
from vllm_pcd.serving import metrics
from vllm_pcd.serving.errors import ErrorAnswer, client_fault, fault_message
from vllm_pcd.serving.guard import ApiKeys

logger = init_logger("vllm.pcd.server")

PCD_KEYS = ("pcd_schema", *KEYS.values())
# Log-probabilities are what PCD adds up; these modes return something else.
_LOGIT_MODES = ("raw_logits", "processed_logits")


def off_reason(vllm_config: Any) -> str | None:
    """Why this server's engine cannot give PCD correct scores; None when it can."""
    mode = str(vllm_config.model_config.logprobs_mode)
    if mode in _LOGIT_MODES:
        return (f"--logprobs-mode {mode} returns logits, and PCD adds log-probabilities; "
                "serve with raw_logprobs (the default) or processed_logprobs")
    return None


def profile_advice(vllm_config: Any, limits: Limits) -> str | None:
    """The serving flags that would make PCD run at a fraction of its speed, and what to
    change (FlagOS's release runs `--no-enable-prefix-caching --max-num-seqs 1`); None when
    there are none."""
    advice = []
    if not vllm_config.cache_config.enable_prefix_caching:
        advice.append("drop --no-enable-prefix-caching (without it every branch recomputes the "
                      "whole shared context)")
    seqs = vllm_config.scheduler_config.max_num_seqs
    if seqs <= limits.max_branches_per_batch:
        advice.append(f"raise --max-num-seqs from {seqs} to at least "
                      f"{limits.max_branches_per_batch + 1} (a call's branches run together, "
                      "at most max_branches_per_batch at a time, beside its context)")
    return "; ".join(advice) or None


def _private_tokenizer(engine: Any) -> Any:
    """A copy for PCD's planning thread, so it never shares a Rust tokenizer's borrow with
    vLLM's own tokenization thread."""
    tokenizer = engine.get_tokenizer()
    try:
        return copy.deepcopy(tokenizer)
    except Exception as err:  # a tokenizer class that cannot be copied: share it
        logger.warning("vllm-pcd plans on vLLM's own tokenizer (%s cannot be copied: %s)",
                       type(tokenizer).__name__, err)
        return tokenizer


class PCDService:
    """Per-server state: the engine, its tokenizer, the configured limits and the chat
    template settings of vLLM's own chat route (default kwargs, whether a request may bring
    its own template)."""

    def __init__(self, engine: Any, state: Any, limits: Limits, *,
                 structured_outputs: bool = False, reasoning: bool = False,
                 queue_calls: bool = False, api_keys: ApiKeys | None = None):
        self.engine = engine
        self.api_keys = api_keys or ApiKeys(None)
        self.state = state
        self.limits = limits
        # answer vLLM's structured-output requests by default (`structured`)
        self.structured_outputs = structured_outputs
        self.reasoning = reasoning  # the server parses a thinking phase (--reasoning-parser)
        self.tokenizer = _private_tokenizer(engine)
        self.projection_route = configured_route(state.vllm_config)
        self.profiles = profiles_of(state.vllm_config)
        self.batch_priors = RunningPriors()  # `pcd_calibration: "batch"` online, per tenant
        self.unavailable = off_reason(state.vllm_config)
        parallel = state.vllm_config.parallel_config
        self.engines = (parallel.data_parallel_size_local if parallel.local_engines_only
                        else parallel.data_parallel_size)
        self._next_engine = itertools.count()
        # `vllm run-batch` submits every line at once and nobody retries a 429: there a call
        # waits its turn, at most `max_queued_plans` at once (so planning never overflows),
        # and its time bound starts with its turn.
        self.turns = asyncio.Semaphore(limits.max_queued_plans) if queue_calls else None

    @property
    def serving_chat(self) -> Any:
        return getattr(self.state, "openai_serving_chat", None)

    def chat_template(self, request: ChatCompletionRequest) -> str:
        """The request's own template only where the server trusts request templates."""
        if request.chat_template is not None:
            if not getattr(self.serving_chat, "trust_request_chat_template", False):
                raise SchemaError("Chat template is passed with request, but "
                                  "--trust-request-chat-template is not set. Refused request "
                                  "with untrusted chat template.", param="chat_template",
                                  rule="chat_template")
            return request.chat_template
        return self.server_chat_template

    @property
    def server_chat_template(self) -> str | None:
        """`--chat-template`, or None for the model's own."""
        return getattr(self.serving_chat, "chat_template", None)

    def template_kwargs(self, given: dict[str, Any] | None) -> dict[str, Any]:
        """`--default-chat-template-kwargs` under the request's own, as vLLM's route merges
        them (a null template variable leaves the default)."""
        defaults = getattr(self.serving_chat, "default_chat_template_kwargs", None) or {}
        kept = {k: v for k, v in (given or {}).items()
                if v is not None or k in PCD_KEYS}  # a null PCD option is refused, not unset
        return {**defaults, **kept}

    def data_parallel_rank(self) -> int | None:
        """One engine for every request of a PCD call (its KV and its admission groups live
        there); calls take the engines in turn."""
        return next(self._next_engine) % self.engines if self.engines > 1 else None

    def model_error(self, model: str | None) -> ErrorAnswer | None:
        models = self.state.openai_serving_models
        if model and not models.is_base_model(model):
            return ErrorAnswer(HTTPStatus.NOT_FOUND, f"The model `{shown(model)}` does not "
                               "exist.", "model", "NotFoundError")
        return None

    @property
    def reveals_cache(self) -> bool:
        """vLLM's rule: cache hits are reported only with --enable-prompt-tokens-details
        (without a cache_salt they tell one tenant what another sent)."""
        return bool(getattr(self.serving_chat, "enable_prompt_tokens_details", False))

    def refusal(self, model: str | None) -> ErrorAnswer | None:
        """501 where PCD is off on this server, 404 for a model it does not serve."""
        if self.unavailable is not None:
            return ErrorAnswer(HTTPStatus.NOT_IMPLEMENTED, f"PCD is off on this server: "
                               f"{self.unavailable}", kind="NotImplementedError")
        return self.model_error(model)

    async def checked(self, check: Any, *args: Any) -> Any:
        """A request check whose cost grows with the body (a schema's parse) runs on PCD's
        planning thread, never on the event loop, within the call's time bound: `/health`
        and every other request go on meanwhile."""
        async with asyncio.timeout(self.limits.max_request_seconds):
            return await PLANNER.run(check, *args)

    async def count_tokens(self, text: str) -> int:
        """Tokens `text` takes, counted on PCD's own planning thread and tokenizer."""
        return len(await PLANNER.run(self.tokenizer.encode, text, add_special_tokens=False))

    def online(self) -> Online:
        return Online(self.engine, self.tokenizer, self.limits, self.projection_route,
                      self.profiles, self.batch_priors)

    async def run(self, messages: list[dict[str, Any]], spec: SchemaSpec, options: Options,
                  template_kwargs: dict[str, Any], *, chat_template: str | None,
                  cache_salt: str | None, request_id: str, mode_label: str,
                  tenant: str | None = None) -> PCDResult | ErrorAnswer:
        """The PCD call every route makes, bounded by `limits.max_request_seconds`: its result,
        or the error to answer (4xx for what the request caused, 504, 500 for our faults)."""
        async with self.turns or contextlib.nullcontext():
            start = time.perf_counter()
            bound = self.limits.max_request_seconds
            call = Call(template_kwargs, chat_template, request_id, cache_salt,
                        self.data_parallel_rank(), tenant)
            try:
                check_conversation(messages, self.limits)  # before it waits for the planner
                async with asyncio.timeout(bound):
                    result = await answer_online(self.online(), spec, messages, options, call)
            except SchemaError as err:  # limits that depend on the tokenized prompt
                return ErrorAnswer(HTTPStatus.BAD_REQUEST, str(err), err.param)
            except Overloaded as err:
                return ErrorAnswer(HTTPStatus.TOO_MANY_REQUESTS, str(err),
                                   kind="TooManyRequestsError")
            except TimeoutError:
                logger.warning("PCD request %s aborted after its %d s bound", request_id, bound)
                return ErrorAnswer(HTTPStatus.GATEWAY_TIMEOUT,
                                   f"PCD request did not finish within {bound} s "
                                   "(limits.max_request_seconds); its engine work was aborted",
                                   kind="TimeoutError")
            except Exception as err:
                if (refused := client_fault(err)) is not None:
                    return refused
                logger.exception("PCD request %s failed", request_id)  # this request only
                return ErrorAnswer(HTTPStatus.INTERNAL_SERVER_ERROR,
                                   fault_message(err, request_id), kind="InternalServerError")
            diagnostics = result.diagnostics()
            metrics.record_answer(mode_label, len(spec.fields), spec.total_candidates,
                                  diagnostics["tokens"]["computed"], time.perf_counter() - start,
                                  diagnostics["projection"])
            return result
