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
    """The error vLLM's input validation raises for a bad request, which its routes answer
    with a 400. It also carries `pcd_refusal` (param, message): a route that lets it escape
    (vLLM 0.24's token-in and tokenize routes) is answered with that 400 by the guard."""
    if vllm_version() == "0.24.0":
        err: Exception = _Refusal024(message)
    else:
        err = _refusal_class()(message, parameter=param)
    err.pcd_refusal = (param, message)  # type: ignore[attr-defined]
    return err


class _Refusal024(ValueError):
    """vLLM 0.24 validates with plain ValueErrors."""


def _refusal_class() -> type[Exception]:
    from vllm.exceptions import VLLMValidationError

    class PCDRefusal(VLLMValidationError, ValueError):
        """vLLM 0.32's validation error, and a ValueError for the routes that catch those."""

    return PCDRefusal
