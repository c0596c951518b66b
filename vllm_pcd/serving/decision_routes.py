"""PCD on vLLM's decision routes: `POST /v1/systemone` (vLLM 0.32's shape) and
`POST /v1/decisions` (vLLM 0.33's), for every model the plugin serves.

Each question becomes a field of one schema (`decisions`), answered by the same plan, fork
and limits as the chat route, on the stock LM head: a decision reports `label_mass`, the mass
the options hold over the whole vocabulary, which the restricted head cannot measure. A
systemone body with `"pcd": false` goes to vLLM's own handler where this vLLM has one.
"""

from __future__ import annotations

import inspect
import uuid
from dataclasses import dataclass, replace
from http import HTTPStatus
from typing import Any, Awaitable, Callable

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import ValidationError
from vllm.entrypoints.serve.utils.api_utils import validate_json_request, with_cancellation

from vllm_pcd.serving.decision_protocol import DecisionsRequest, SystemOneRequest
from vllm_pcd.serving.decisions import (Question, Read, check_cache_salt, decisions_request,
                                decisions_response, systemone_request, systemone_response,
                                to_schema)
from vllm_pcd.core.plan import Options
from vllm_pcd.core.result import PCDResult
from vllm_pcd.core.schema import SchemaError, parse_schema
from vllm_pcd.serving.errors import ErrorAnswer, error_response
from vllm_pcd.serving.service import PCDService

SYSTEMONE_PATH = "/v1/systemone"
DECISIONS_PATH = "/v1/decisions"
Endpoint = Callable[..., Awaitable[Any]]


def _post_route(app: FastAPI, path: str) -> APIRoute | None:
    return next((r for r in app.routes if isinstance(r, APIRoute) and r.path == path
                 and r.methods == {"POST"}), None)


def _bad_request(err: SchemaError) -> JSONResponse:
    """Schema errors name the question, not the schema PCD built from it."""
    def renamed(text: str) -> str:
        return text.replace("pcd_schema.properties", "questions")
    return error_response(HTTPStatus.BAD_REQUEST, renamed(str(err)), param=renamed(err.param))


@dataclass(frozen=True)
class Decided:
    """A decision PCD answered: what the route needs to write either response shape."""

    service: PCDService
    questions: list[Question]
    result: PCDResult
    reads: list[Read]

    @property
    def model(self) -> str:
        return self.service.state.openai_serving_models.model_name()


async def _decide(raw_request: Request, model: str | None,
                  parse: Callable[[], tuple[list[Question], list[dict[str, Any]]]],
                  template_kwargs: dict[str, Any] | None, cache_salt: Any, joint: bool = False
                  ) -> Decided | JSONResponse:
    """A decision request through PCD: its questions (`parse`) as one schema, then one read
    per question; or the error response that names what is wrong. Its engine requests get
    fresh ids of their own: a client's id (`X-Request-Id`, `request_id`) names only the
    response, so no client can collide with, or abort, another's requests."""
    service: PCDService | None = getattr(raw_request.app.state, "pcd", None)
    if service is None:
        return error_response(HTTPStatus.SERVICE_UNAVAILABLE, "PCD is not initialised",
                              kind="ServiceUnavailableError")
    if (refused := service.refusal(model)) is not None:
        return refused.response()
    kwargs = service.template_kwargs(template_kwargs)
    try:
        questions, messages = parse()
        check_cache_salt(cache_salt)
        options = Options.from_template_kwargs(kwargs)  # `joint`: the request's own flag too
        options = replace(options, full_vocabulary=True, joint=options.joint or joint)
        if "pcd_schema" in kwargs:
            raise SchemaError("chat_template_kwargs.pcd_schema: a decision request's schema is "
                              "its questions", param="chat_template_kwargs.pcd_schema")
        if len(questions) > service.limits.max_fields:
            raise SchemaError(f"questions: at most {service.limits.max_fields} for this model",
                              param="questions", rule="max_fields")
        spec = await service.checked(parse_schema, to_schema(questions), service.limits)
    except SchemaError as err:
        return _bad_request(err)
    result = await service.run(messages, spec, options, kwargs,
                               chat_template=service.server_chat_template, cache_salt=cache_salt,
                               request_id=f"decision-pcd-{uuid.uuid4().hex}",
                               mode_label=options.mode,
                               tenant=service.api_keys.tenant(raw_request))
    if isinstance(result, ErrorAnswer):
        return result.response()
    reads = [Read.of(q, r.field.options, r.scores, r.extra)
             for q, r in zip(questions, result.fields)]
    return Decided(service, questions, result, reads)


def _validated_for(endpoint: Endpoint, body: Any) -> Any:
    """`body` as the request model vLLM's own handler declares."""
    model = inspect.signature(endpoint, eval_str=True).parameters["request"].annotation
    return model.model_validate(body)


def systemone_endpoint(stock: Endpoint | None) -> Endpoint:
    @with_cancellation
    async def create_structured_decision(request: SystemOneRequest, raw_request: Request):
        if (request.model_extra or {}).get("pcd") is False:
            return await _stock_answer(stock, raw_request)
        base_id = raw_request.headers.get("X-Request-Id") or request.request_id
        done = await _decide(raw_request, request.model, lambda: systemone_request(request),
                             request.chat_template_kwargs, request.cache_salt)
        if isinstance(done, JSONResponse):
            return done
        diagnostics = done.result.diagnostics(done.service.reveals_cache)
        return JSONResponse(content={
            **systemone_response(base_id, done.model, done.questions, done.reads,
                                 diagnostics["tokens"]["ideal"]),
            "pcd": diagnostics})
    return create_structured_decision


async def _stock_answer(stock: Endpoint | None, raw_request: Request) -> Any:
    """vLLM's own `/v1/systemone` answer (`"pcd": false`), for the models it supports."""
    if stock is None:
        return error_response(HTTPStatus.NOT_IMPLEMENTED, "this vLLM has no /v1/systemone of "
                              "its own", kind="NotImplementedError")
    try:
        request = _validated_for(stock, await raw_request.json())
    except ValidationError as err:
        return error_response(HTTPStatus.BAD_REQUEST, str(err), param="body")
    return await stock(request, raw_request)


@with_cancellation
async def create_decisions(request: DecisionsRequest, raw_request: Request):
    done = await _decide(raw_request, request.model, lambda: decisions_request(request), None,
                         request.cache_salt, request.joint)
    if isinstance(done, JSONResponse):
        return done
    tokens = done.result.diagnostics(done.service.reveals_cache)["tokens"]
    return JSONResponse(content=decisions_response(done.model, done.questions, done.reads,
                                                   tokens["ideal"],
                                                   tokens.get("computed", tokens["ideal"])))


def attach(app: FastAPI) -> None:
    """Replaces vLLM's `/v1/systemone` (kept behind `"pcd": false`) and adds `/v1/decisions`."""
    stock = _post_route(app, SYSTEMONE_PATH)
    app.router.routes[:] = [r for r in app.router.routes if r not in (
        stock, _post_route(app, DECISIONS_PATH))]
    app.add_api_route(SYSTEMONE_PATH, systemone_endpoint(stock and stock.endpoint),
                      methods=["POST"], dependencies=[Depends(validate_json_request)])
    app.add_api_route(DECISIONS_PATH, create_decisions, methods=["POST"],
                      dependencies=[Depends(validate_json_request)])
