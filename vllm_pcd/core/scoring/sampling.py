"""Drawing an answer from PCD's exact distribution over each field's values.

Grammar-constrained decoding samples token by token, so the chance of a value is not the
model's probability of it. PCD has every value's probability, so at temperature T > 0 it
draws each field's value from them, sharpened or flattened by T, and, as nucleus sampling
does over tokens, keeps only the most probable values that hold `top_p` of the mass.
"""

from __future__ import annotations

import math
import random
from typing import Any, Sequence

from vllm_pcd.core.scoring.field_result import FieldResult


def value_distribution(scores: Sequence[float], temperature: float, top_p: float = 1.0
                       ) -> list[float]:
    """Each option's chance of being drawn at `temperature` > 0 (at 0 a field answers its
    own decision, `draw_values`)."""
    top = max(scores)
    weights = [math.exp((s - top) / temperature) for s in scores]
    total = sum(weights)
    chances = [w / total for w in weights]
    if top_p < 1.0:
        kept, mass = set(), 0.0
        for i in sorted(range(len(chances)), key=lambda i: (-chances[i], i)):
            kept.add(i)
            mass += chances[i]
            if mass >= top_p:
                break
        held = sum(chances[i] for i in kept)
        chances = [c / held if i in kept else 0.0 for i, c in enumerate(chances)]
    return chances


def draw_values(results: Sequence[FieldResult], temperature: float, top_p: float = 1.0,
                seed: int | None = None) -> list[Any]:
    """One value per field, drawn independently (the fields were scored independently); the
    same seed draws the same values."""
    rng = random.Random(seed)
    out = []
    for r in results:
        if temperature <= 0:  # the field's own decision, greedy or most probable
            out.append(r.value)
            continue
        chances = value_distribution(r.scores, temperature, top_p)
        out.append(r.field.options[rng.choices(range(len(chances)), weights=chances)[0]])
    return out
