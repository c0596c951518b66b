"""Client errors as the running vLLM writes them (its adapter, `internals.version`)."""

from __future__ import annotations

from typing import Any

from vllm_pcd.internals.version import adapter


def client_error_types() -> tuple[type[BaseException], ...]:
    return adapter().client_error_types()


def vllm_error_response(err: BaseException) -> Any:
    """vLLM's ErrorResponse for `err` (its `.error` has code, message, param and type)."""
    return adapter().error_response(err)


def client_error(message: str, param: str) -> Exception:
    """The error vLLM's input validation raises for a bad request, which its routes answer
    with a 400. It also carries `pcd_refusal` (param, message): a route that lets it escape
    (the token-in and tokenize routes of some versions) is answered with that 400 by the
    guard."""
    err = adapter().client_error(message, param)
    err.pcd_refusal = (param, message)  # type: ignore[attr-defined]
    return err
