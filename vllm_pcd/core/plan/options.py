"""A request's PCD options: one frozen value, checked once, where it is built.

Every door (chat completion, decision routes, offline API) builds an `Options` and passes it
whole; nothing below re-checks an option or carries one by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from vllm_pcd.core.scoring import CALIBRATIONS, DECISIONS, NORMALIZATIONS
from vllm_pcd.core.plan.prompt import (DEFAULT_FORMULATION, DEFAULT_LAYOUT, FORMULATION_NAMES,
                                       LAYOUT_NAMES, Formulation, Layout)
from vllm_pcd.core.schema import MODES, SchemaError, shown

# The request's `chat_template_kwargs` key of each client-settable option.
KEYS = {"mode": "pcd_mode", "normalization": "pcd_normalization",
        "formulation": "pcd_formulation", "layout": "pcd_layout",
        "calibration": "pcd_calibration", "joint": "pcd_joint", "decision": "pcd_decision"}
_CHOICES = {"mode": MODES, "normalization": tuple(NORMALIZATIONS),
            "formulation": FORMULATION_NAMES, "layout": LAYOUT_NAMES, "calibration": CALIBRATIONS,
            "decision": tuple(DECISIONS)}
# The options given by name and held resolved.
_RESOLVED = {"formulation": Formulation, "layout": Layout}


@dataclass(frozen=True)
class Options:
    """`mode` is the default for fields without their own `x-pcd-mode`; `normalization`
    applies to sequence-mode values; `calibration="content_free"` divides out the schema's
    content-free prior. `joint` answers the fields in schema order, each reading the values
    chosen before it (`conditioning`). `decision` chooses each field's value from its
    scores (`scoring.decision`). `full_vocabulary` keeps the stock LM head for every scoring,
    so each field also reports its options' mass over the whole vocabulary (the decision
    routes ask for it; a client of the chat route cannot). `formulation` and `layout` are
    given by name and held resolved (`prompt.Formulation`, `prompt.Layout`), so nothing below
    compares their names."""

    mode: str = "token"
    normalization: str = "sum"
    formulation: Formulation = Formulation.named(DEFAULT_FORMULATION)
    layout: Layout = Layout.named(DEFAULT_LAYOUT)
    calibration: str = "none"
    joint: bool = False
    decision: str = "auto"
    full_vocabulary: bool = False

    def __post_init__(self) -> None:
        for name, choices in _CHOICES.items():
            value = getattr(self, name)
            if isinstance(value, _RESOLVED.get(name, ())):
                continue
            if not isinstance(value, str) or value not in choices:
                raise SchemaError(f"{KEYS[name]} must be one of {list(choices)}, got "
                                  f"{shown(value)}", param=KEYS[name], rule=name)
        for name in ("joint", "full_vocabulary"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                key = KEYS.get(name, name)
                raise SchemaError(f"{key} must be a boolean, got {shown(value)}", param=key,
                                  rule=name)
        for name, kind in _RESOLVED.items():
            if isinstance(getattr(self, name), str):
                object.__setattr__(self, name, kind.named(getattr(self, name)))

    def settings(self, names: tuple[str, ...]) -> dict[str, Any]:
        """The named options as a request writes them (JSON: a formulation or layout by name)."""
        return {name: getattr(self, name).name if name in _RESOLVED else getattr(self, name)
                for name in names}

    @classmethod
    def from_template_kwargs(cls, kwargs: dict[str, Any]) -> Options:
        """Pops the PCD options (not `pcd_schema`) from a request's chat-template kwargs."""
        return cls(**{name: kwargs.pop(key) for name, key in KEYS.items() if key in kwargs})

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Options:
        """From keyword values (the offline API's), refusing names that are not options."""
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown PCD option(s) {sorted(unknown)}")
        return cls(**values)
