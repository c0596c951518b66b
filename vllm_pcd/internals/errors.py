"""Which engine errors a request caused, and vLLM's own answer for them, per vLLM version:
0.32 marks client faults with `VLLMClientError` / `GracefulHTTPError` (admission control,
with its own status), 0.24 re-raises a request's `ValueError`s as they are."""

from __future__ import annotations

from typing import Any

from vllm_pcd.compat import vllm_version


def client_error_types() -> tuple[type[BaseException], ...]:
    if vllm_version() == "0.24.0":
        return (ValueError,)
    from vllm.exceptions import GracefulHTTPError, VLLMClientError

    return (VLLMClientError, GracefulHTTPError)


def vllm_error_response(err: BaseException) -> Any:
    """vLLM's ErrorResponse for `err` (its `.error` has code, message, param and type)."""
    if vllm_version() == "0.24.0":
        from vllm.entrypoints.serve.utils.error_response import create_error_response
    else:
        from vllm.entrypoints.serve.exception_handling.error_response import (
            create_error_response)
    return create_error_response(err)


def client_error(message: str, param: str) -> Exception:
    """The error vLLM's input validation raises for a bad request: its routes answer it with
    a 400 naming `param`."""
    if vllm_version() == "0.24.0":
        return ValueError(message)
    from vllm.exceptions import VLLMValidationError

    return VLLMValidationError(message, parameter=param)
