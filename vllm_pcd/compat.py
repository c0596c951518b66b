"""The vLLM versions this plugin is built and tested against.

Every touch of vLLM internals is checked against this list first: on a version we have not
tested, the plugin refuses to load with a clear message instead of silently degrading.
"""

from __future__ import annotations

import sys

# Each supported version and its adapter, `vllm_pcd.internals.<adapter>`: the one place that
# knows what differs between them (`vllm_pcd.internals.version.VersionAdapter`).
# 0.33 is written from its wheel's sources only: no CPU build of it exists (README).
ADAPTERS = {"0.24.0": "v0_24", "0.32.0": "v0_32", "0.33.0": "v0_33"}
SUPPORTED_VLLM_VERSIONS = tuple(ADAPTERS)


class UnsupportedVLLMVersion(RuntimeError):
    pass


def vllm_version() -> str:
    import vllm

    return vllm.__version__.split("+")[0]


def check_vllm_version() -> str:
    version = vllm_version()
    if version not in SUPPORTED_VLLM_VERSIONS:
        raise UnsupportedVLLMVersion(
            f"vllm-pcd supports vLLM {', '.join(SUPPORTED_VLLM_VERSIONS)}; found {version}. "
            "Install a supported vLLM or a vllm-pcd release that lists this version.")
    return version


def adapter_name() -> str:
    """The running vLLM's adapter module, under `vllm_pcd.internals`; refuses an untested
    version."""
    return ADAPTERS[check_vllm_version()]


# Every vLLM function a patch replaces or calls through, as `require_methods` checked it:
# (defining module, qualified name) → (patch, parameters as (name, kind) pairs). The wheel
# check (`vllm_pcd.targets`) compares another vLLM's sources against it.
PATCH_TARGETS: dict[tuple[str, str], tuple[str, tuple[tuple[str, str], ...]]] = {}


def require_methods(target: object, *names: str, patch: str) -> None:
    """A patch's targets (methods of a class, or functions of a module) must exist as written
    for: refuse loudly instead of degrading. Each is recorded in PATCH_TARGETS."""
    missing = [n for n in names if not callable(getattr(target, n, None))]
    if missing:
        name = getattr(target, "__qualname__", None) or getattr(target, "__name__", target)
        raise UnsupportedVLLMVersion(
            f"vllm-pcd {patch}: {name} lacks {missing}; this vLLM is not the one the patch "
            "was written for")
    for name in names:
        PATCH_TARGETS.setdefault(_where(target, name), (patch, parameters(getattr(target, name))))


def _where(target: object, name: str) -> tuple[str, str]:
    """(module, qualified name) of the class in `target`'s MRO, or the module, defining it."""
    for owner in getattr(target, "__mro__", ()):
        if name in vars(owner):
            return owner.__module__, f"{owner.__qualname__}.{name}"
    return getattr(target, "__name__", str(target)), name


def parameters(function: object) -> tuple[tuple[str, str], ...]:
    """A function's parameters as (name, kind), kinds as `inspect.Parameter` names them."""
    import inspect

    return tuple((p.name, p.kind.name) for p in inspect.signature(function).parameters.values())


def main(argv: list[str]) -> int:
    if argv[1:] != ["check"]:
        print("usage: python -m vllm_pcd.compat check", file=sys.stderr)
        return 2
    print(f"vLLM {check_vllm_version()}: supported by vllm-pcd")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
