"""The operator's PCD configuration: `--additional-config '{"pcd": {...}}'` (or an offline
`LLM(additional_config=...)`), read the same way by every part that reads it. A key PCD does not
know refuses the start, naming it: a typo (`structured_output`, `limit`) would otherwise leave
the server running without what the operator asked for."""

from __future__ import annotations

import json
from typing import Any

# key -> (what it holds, the types that hold it)
KEYS: dict[str, tuple[str, tuple[type, ...]]] = {
    "limits": ("an object of limits", (dict,)),
    "structured_outputs": ("true or false", (bool,)),
    "projection": ("a projection route name", (str,)),
    "calibration_profiles": ("a path or a list of paths", (str, list)),
    "strict_coverage": ("true or false", (bool,)),
}


def pcd_config(additional_config: Any) -> dict[str, Any]:
    """`additional_config.pcd`, checked: an object of known keys with values of their type."""
    extra = additional_config or {}
    if isinstance(extra, str):
        extra = json.loads(extra)
    config = extra.get("pcd") if isinstance(extra, dict) else None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ValueError("additional_config.pcd must be an object")
    unknown = sorted(set(config) - set(KEYS))
    if unknown:
        raise ValueError(f"additional_config.pcd: unknown key(s) {unknown}; the known keys are "
                         f"{sorted(KEYS)}")
    for key, value in config.items():
        what, types = KEYS[key]
        if isinstance(value, bool) is not (bool in types) or not isinstance(value, types):
            raise ValueError(f"additional_config.pcd.{key} must be {what}, got {value!r:.80}")
    return config
