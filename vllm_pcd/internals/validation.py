"""The API server checks every request's PCD tag where vLLM validates its parameters.

A client reaches `SamplingParams.extra_args` from many doors: `vllm_xargs` in JSON (escaped
or in UTF-16 too), in multipart forms (transcription), `sampling_params.extra_args` on the
token-in route, batch files. Byte filters cannot see all of them; vLLM's input processor
sees every request after parsing, in the API server, before it is sent to the engine. A
tag this deployment did not sign, or any other `pcd*` key, is refused there with the error
vLLM's own validation raises, which every route answers with a 400 naming `vllm_xargs`.
PCD's own requests carry signed tags and pass.

Runs in: the API server process.
Changes: `InputProcessor._validate_params` also checks the request's PCD tag.
Remove when: vLLM lets a plugin validate the `extra_args` it owns (a request-validation hook).
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_pcd.compat import require_methods
from vllm_pcd.internals.errors import client_error
from vllm_pcd.internals.tags import BadTag, check


def checked(params: Any) -> None:
    extra = getattr(params, "extra_args", None)
    try:
        check(extra)
    except BadTag as err:
        raise client_error(f"{err}: vllm_xargs keys starting with 'pcd' are reserved for "
                           "vllm-pcd's engine channel; PCD options go in "
                           "chat_template_kwargs", "vllm_xargs") from None


def apply() -> None:
    from vllm.v1.engine.input_processor import InputProcessor

    require_methods(InputProcessor, "_validate_params", patch="validation")
    validate = InputProcessor._validate_params

    @functools.wraps(validate)
    def validate_with_tags(self: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        checked(params)
        return validate(self, params, *args, **kwargs)

    InputProcessor._validate_params = validate_with_tags
