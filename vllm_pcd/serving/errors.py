"""Error answers in OpenAI's format, and which failures are the client's.

Every part of a request is a client's: whatever it holds, the client gets a 2xx or a 4xx
naming the problem; only a fault of the server or the engine is a 5xx.
"""

from __future__ import annotations

import itertools
from http import HTTPStatus
from dataclasses import dataclass
from typing import Any, Iterator

from fastapi.responses import JSONResponse

from vllm_pcd.core.schema import shown
from vllm_pcd.internals.errors import client_error_types, vllm_error_response


@dataclass(frozen=True)
class ErrorAnswer:
    """An error in OpenAI's format, as vLLM's own routes answer."""

    status: HTTPStatus
    message: str
    param: str | None = None
    kind: str = "BadRequestError"

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.status.value}}

    def response(self) -> JSONResponse:
        return JSONResponse(status_code=self.status.value, content=self.body())


def error_response(status: HTTPStatus, message: str, *, param: str | None = None,
                   kind: str = "BadRequestError") -> JSONResponse:
    return ErrorAnswer(status, message, param, kind).response()


def _causes(err: BaseException | None) -> Iterator[BaseException]:
    """The error, then what caused it: into a TaskGroup's group (its first failure) and along
    `raise ... from`."""
    while err is not None:
        if isinstance(err, BaseExceptionGroup):
            err = err.exceptions[0]
            continue
        yield err
        err = err.__cause__


def fault_message(err: BaseException, request_id: str) -> str:
    """What failed, for the client: vLLM wraps a request's failure in an EngineGenerateError
    without a message, so its causes are named too (bounded), and the request id finds the
    traceback in the server log."""
    named = [f"{type(e).__name__}: {shown(str(e))}" if str(e) else type(e).__name__
             for e in itertools.islice(_causes(err), 3)]
    return (f"PCD inference failed ({'; caused by '.join(named)}); see the server log for "
            f"{request_id}")


def client_fault(err: BaseException) -> ErrorAnswer | None:
    """vLLM's own answer for an engine refusal the request caused (validation, admission
    control): the same 4xx or 429 its routes give. None for a server fault."""
    cause = next((e for e in _causes(err) if isinstance(e, client_error_types())), None)
    if cause is None:
        return None
    error = vllm_error_response(cause).error  # ErrorResponse → its ErrorInfo
    return ErrorAnswer(HTTPStatus(error.code), error.message, error.param, error.type)
