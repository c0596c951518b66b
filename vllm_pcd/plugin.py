"""`vllm.general_plugins` entry: runs in every vLLM process (API server, engine core, worker).

vLLM loads every installed general plugin when `VLLM_PLUGINS` is unset, so being installed
is not being asked for: PCD patches nothing unless `pcd` is named in `VLLM_PLUGINS`. On a
vLLM version it was not written for it says so in one log line and stands aside, leaving the
host's vLLM as it is.
"""

from __future__ import annotations

import os
import sys

from vllm_pcd.compat import UnsupportedVLLMVersion

PLUGIN_NAME = "pcd"


def requested() -> bool:
    """Whether this process was asked for PCD: `pcd` named in `VLLM_PLUGINS`."""
    names = os.environ.get("VLLM_PLUGINS")
    return names is not None and PLUGIN_NAME in {n.strip() for n in names.split(",")}


def register() -> None:
    from vllm.logger import init_logger

    logger = init_logger("vllm.pcd.plugin")
    if not requested():
        logger.debug("vllm-pcd is installed but not enabled (VLLM_PLUGINS does not name pcd)")
        return
    from vllm_pcd import internals

    try:
        internals.apply()
    except UnsupportedVLLMVersion as err:
        logger.warning("vllm-pcd is off, vLLM runs as stock: %s", err)
        return
    from vllm_pcd.internals import entry_points

    if entry_points.loaded():  # the API server or the batch runner, not an engine process
        from vllm_pcd.serving.endpoint import PCDEndpointPlugin

        entry_points.attach(PCDEndpointPlugin())
    elif "vllm.entrypoints.llm" in sys.modules:  # a process that builds an offline `LLM`
        from vllm_pcd.internals import handler
        from vllm_pcd.serving.offline import answer_offline_chat

        handler.install_offline_chat_hook(answer_offline_chat)
