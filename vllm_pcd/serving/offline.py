"""The offline door: `LLM.chat(..., sampling_params=SamplingParams(structured_outputs=...))`
answered by PCD where a server would answer the same body by PCD (`structured`).

It opts in as a server does (`additional_config.pcd.structured_outputs`, or the call's
`chat_template_kwargs.pcd_structured_outputs`) and hands to vLLM's own generation whatever a
server hands to it: several samples, log-probabilities, stop conditions, token-level
controls, tools, a custom template, a continued message, non-text content, a value longer
than `max_tokens`. The outputs are vLLM's `RequestOutput`s, one per conversation, whose text
is the choice or the compact object; each carries PCD's diagnostics as `.pcd`.
"""

from __future__ import annotations

import uuid
from typing import Any

from vllm.outputs import CompletionOutput, RequestOutput

from vllm_pcd.core.config import pcd_config
from vllm_pcd.core.schema import Limits, SchemaError
from vllm_pcd.pipeline import constrained
from vllm_pcd.serving.structured import (Constraint, constraint_of, own_choice, reply_text,
                                         requested)

# Sampling parameters and the values at which they leave a one-pass choice unchanged.
_NEUTRAL = {"n": (1,), "logprobs": (None,), "prompt_logprobs": (None,), "stop": (None, []),
            "stop_token_ids": (None, []), "logit_bias": (None, {}),
            "allowed_token_ids": (None, []), "bad_words": (None, []), "min_tokens": (0,),
            "presence_penalty": (0.0,), "frequency_penalty": (0.0,),
            "repetition_penalty": (1.0,), "top_k": (0, -1, None), "min_p": (0.0,),
            "ignore_eos": (False,)}
_CALL_NEUTRAL = {"lora_request": None, "chat_template": None, "tools": None,
                 "add_generation_prompt": True, "continue_final_message": False,
                 "mm_processor_kwargs": None}


def _config(llm: Any) -> dict[str, Any]:
    """The engine's `additional_config.pcd`, checked as a server checks it."""
    return pcd_config(llm.llm_engine.vllm_config.additional_config)


def _opted_in(llm: Any, kwargs: dict[str, Any]) -> bool:
    """The call's own choice (taken out of its template kwargs), else the engine's option."""
    own = own_choice(kwargs)
    return _config(llm).get("structured_outputs", False) if own is None else own


def _conversations(messages: Any) -> list[list[dict[str, str]]] | None:
    """The call's conversations as text turns, or None where one holds anything else."""
    many = isinstance(messages, (list, tuple)) and bool(messages) \
        and all(isinstance(m, (list, tuple)) for m in messages)
    out = []
    for conversation in (messages if many else [messages]):
        turns = []
        for message in conversation:
            if not isinstance(message, dict) or not isinstance(message.get("content"), str) \
                    or set(message) - {"role", "content", "name"}:
                return None
            turns.append({"role": str(message.get("role")), "content": message["content"]})
        out.append(turns)
    return out


def _constraint(sampling: Any, limits: Limits) -> Constraint | None:
    """The call's finite-choice constraint, or None where its sampling asks more of vLLM."""
    if sampling is None or isinstance(sampling, (list, tuple)) \
            or any(getattr(sampling, k, None) not in v for k, v in _NEUTRAL.items()):
        return None
    params = getattr(sampling, "structured_outputs", None)
    if params is None:
        return None
    return constraint_of(*requested(params, {}, None, None), limits)


def answer_offline_chat(llm: Any, arguments: dict[str, Any]) -> list[RequestOutput] | None:
    """PCD's outputs for one `LLM.chat` call, or None for vLLM's own generation."""
    kwargs = dict(arguments.get("chat_template_kwargs") or {})
    if not _opted_in(llm, kwargs) or any(arguments.get(k) != v
                                         for k, v in _CALL_NEUTRAL.items()):
        return None
    if kwargs.get("enable_thinking") is True:
        return None  # the model would think before its constrained answer
    sampling = arguments.get("sampling_params")
    limits = Limits.from_mapping(_config(llm).get("limits"))  # the operator's, as a server's
    constraint = _constraint(sampling, limits)
    conversations = _conversations(arguments["messages"]) if constraint is not None else None
    if conversations is None:
        return None
    try:
        results = constrained(llm, conversations, constraint.schema, constraint.options,
                              limits=limits, template_kwargs=kwargs)
    except SchemaError:
        return None  # a PCD limit: vLLM's path may still answer it
    tokenizer = llm.get_tokenizer()
    outputs = []
    for result in results:
        text = reply_text(constraint, result.fields, sampling.temperature, sampling.top_p,
                          sampling.seed)
        token_ids = tokenizer.encode(text, add_special_tokens=False)
        if sampling.max_tokens is not None and len(token_ids) >= sampling.max_tokens:
            return None  # vLLM's path stops it at max_tokens
        output = RequestOutput(
            f"pcd-{uuid.uuid4().hex}", None, list(result.plan.shared_ids), None,
            [CompletionOutput(index=0, text=text, token_ids=token_ids, cumulative_logprob=None,
                              logprobs=None, finish_reason="stop")], True)
        output.pcd = result.diagnostics()
        outputs.append(output)
    return outputs

