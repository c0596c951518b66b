"""Decision questions as a PCD schema, and PCD's field scores as decision answers.

vLLM ships two request shapes for the job PCD does: `/v1/systemone` (0.32: a `state` and a
mapping of `noul`/`choice`/`score` questions) and `/v1/decisions` (0.33: an `input` and a list
of `predicate`/`choice`/`score` questions). Both become one closed flat schema, one field per
question (yes/no → boolean, choice → enum of its options, score → enum of its levels), so a
decision request is planned, forked and scored exactly like a chat request with `pcd_schema`.
This module is pure: the HTTP route (`decision_routes`) validates the bodies
(`decision_protocol`) and calls PCD; here a question is mapped and an answer written.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

from vllm_pcd.serving.decision_protocol import DecisionsRequest, SystemOneRequest
from vllm_pcd.core.schema import SchemaError

_MAX_SALT_CHARS = 128
_SALT_FORBIDDEN = frozenset("@/\\\x00")
_MAX_KEY_CHARS = 64  # a field name's limit in `schema`


@dataclass(frozen=True)
class Question:
    """One question as a schema field: `key` is the field name the model reads."""

    id: str                      # the client's id (systemone key, or the list index)
    name: str | None             # the client's name (`/v1/decisions`), echoed back
    kind: str                    # "noul" | "predicate" | "choice" | "score"
    key: str
    instructions: str
    options: tuple[Any, ...]     # in the client's order; yes/no questions: (True, False)
    descriptions: tuple[str | None, ...]

    @property
    def boolean(self) -> bool:
        return all(isinstance(o, bool) for o in self.options)

    def description(self) -> str | None:
        """The instructions, then what each described option means."""
        described = [f"{_shown(o)}: {d}" for o, d in zip(self.options, self.descriptions) if d]
        text = "; ".join(filter(None, [self.instructions.strip(), "; ".join(described)]))
        return text or None

    def field(self) -> dict[str, Any]:
        raw: dict[str, Any] = ({"type": "boolean"} if self.boolean else
                               {"type": "string", "enum": list(self.options)})
        if (description := self.description()) is not None:
            raw["description"] = description
        return raw


def _shown(option: Any) -> str:
    return json.dumps(option) if isinstance(option, bool) else str(option)


def to_schema(questions: Sequence[Question]) -> dict[str, Any]:
    keys = [q.key for q in questions]
    return {"type": "object", "additionalProperties": False, "required": keys,
            "properties": {q.key: q.field() for q in questions}}


def check_cache_salt(salt: Any) -> None:
    """vLLM's rule for prefix-cache salts, with its message."""
    if salt is None:
        return
    if not isinstance(salt, str) or not salt:
        raise SchemaError("Parameter 'cache_salt' must be a non-empty string if provided.",
                          param="cache_salt", rule="cache_salt")
    if len(salt) > _MAX_SALT_CHARS or _SALT_FORBIDDEN & set(salt):
        raise SchemaError("Parameter 'cache_salt' must be at most 128 characters and must not "
                          "contain '@', '/', '\\\\', or NUL.", param="cache_salt",
                          rule="cache_salt")


def state_text(state: Any) -> str:
    """A `/v1/systemone` state as the model reads it: text verbatim, anything else as JSON."""
    return state if isinstance(state, str) else json.dumps(state, ensure_ascii=False)


def _text(value: Any) -> str:
    return "" if value is None else value if isinstance(value, str) else str(value)


def systemone_question(qid: str, kind: str, instructions: Any, criteria: Any) -> Question:
    """A `/v1/systemone` question, checked with vLLM's rules and messages."""
    if not qid:
        raise SchemaError("question ids must be non-empty", param="questions", rule="question")
    where = f"questions.{qid}"
    if kind == "noul":
        if criteria is not None and (not isinstance(criteria, dict)
                                     or not criteria.keys() <= {"true", "false"}):
            raise SchemaError(f"question {qid!r}: noul criteria must be an object with true "
                              "and false", param=where, rule="criteria")
        sides = criteria or {}
        descriptions = tuple(None if sides.get(k) is None else str(sides[k])
                             for k in ("true", "false"))
        return Question(qid, None, kind, qid, _text(instructions), (True, False), descriptions)
    if kind == "choice":
        if not isinstance(criteria, dict) or not criteria:
            raise SchemaError(f"question {qid!r}: choice criteria must map option names to a "
                              "description or null", param=where, rule="criteria")
        options = tuple(str(name) for name in criteria)
        descriptions = tuple(None if d is None else str(d) for d in criteria.values())
    elif kind == "score":
        if not isinstance(criteria, list) or len(criteria) < 2:
            raise SchemaError(f"question {qid!r}: score criteria must be an ordered list of "
                              "levels", param=where, rule="criteria")
        options, descriptions = tuple(str(level) for level in criteria), (None,) * len(criteria)
    else:
        raise SchemaError(f"unknown question type {kind!r}; supported: "
                          "['choice', 'noul', 'score']", param=where, rule="question_type")
    if len(set(options)) != len(options):
        raise SchemaError(f"question {qid!r}: duplicate option names", param=where,
                          rule="criteria")
    return Question(qid, None, kind, qid, _text(instructions), options, descriptions)


def decisions_question(index: int, kind: str, name: str | None, instructions: str,
                       options: Sequence[tuple[Any, str]], keys_taken: set[str]) -> Question:
    """A `/v1/decisions` question (already validated by its model). Its field is named after
    the question where the name can be one (unique, short), else `question_<n>`."""
    key = name if name and len(name) <= _MAX_KEY_CHARS and name not in keys_taken \
        else f"question_{index + 1}"
    keys_taken.add(key)
    if kind == "predicate":
        return Question(str(index), name, kind, key, instructions, (True, False), (None, None))
    values = tuple(value for value, _ in options)
    kinds = {type(v) for v in values}
    if kinds != {str} and kinds != {bool}:
        raise SchemaError(f"questions[{index}]: PCD scores choices whose values are all "
                          "strings, or exactly true and false; this one mixes "
                          f"{sorted(k.__name__ for k in kinds)}", param=f"questions[{index}]",
                          rule="choices")
    if len(set(values)) != len(values):
        raise SchemaError(f"questions[{index}]: PCD needs distinct level labels",
                          param=f"questions[{index}]", rule="levels")
    return Question(str(index), name, kind, key, instructions, values,
                    tuple(d or None for _, d in options))


@dataclass(frozen=True)
class Read:
    """What PCD measured for one question: the probability of each option (renormalised
    over the options, in the question's order), the mass the options hold over the whole
    vocabulary, and whether the model's greedy first token is one of them."""

    probabilities: tuple[float, ...]
    label_mass: float
    argmax_is_label: bool

    @classmethod
    def of(cls, question: Question, values: Sequence[Any], scores: Sequence[float],
           extra: dict[str, Any]) -> "Read":
        """From a field's scores (log-probabilities over `values`, the field's order) and
        the full-vocabulary measurements in its diagnostics."""
        by_value = {v: math.exp(s) for v, s in zip(values, scores)}
        return cls(tuple(by_value[o] for o in question.options), float(extra["label_mass"]),
                   bool(extra["argmax_is_label"]))

    @property
    def top(self) -> int:
        return max(range(len(self.probabilities)), key=self.probabilities.__getitem__)

    @property
    def confidence(self) -> float:
        """The chosen option's probability over the whole vocabulary, as vLLM defines it."""
        return self.probabilities[self.top] * self.label_mass


def systemone_answer(question: Question, read: Read) -> dict[str, Any]:
    p = read.probabilities
    if question.kind == "noul":
        return {"type": "noul", "noul": p[0], "probabilities": {"yes": p[0], "no": p[1]},
                "confidence": read.confidence}
    if question.kind == "choice":
        return {"type": "choice", "choice": question.options[read.top],
                "probabilities": dict(zip(question.options, p)), "confidence": read.confidence}
    return {"type": "score", "score": sum(i * q for i, q in enumerate(p)),
            "legend": {str(i): o for i, o in enumerate(question.options)},
            "probabilities": {str(i): q for i, q in enumerate(p)},
            "confidence": read.confidence}


def decisions_answer(question: Question, read: Read) -> dict[str, Any]:
    p = read.probabilities
    if question.kind == "predicate":
        return {"type": "predicate", "name": question.name, "probability": p[0]}
    if question.kind == "choice":
        return {"type": "choice", "name": question.name, "choice": question.options[read.top],
                "probabilities": [{"value": o, "probability": q}
                                  for o, q in zip(question.options, p)],
                "confidence": read.confidence}
    return {"type": "score", "name": question.name, "score": sum(i * q for i, q in enumerate(p)),
            "probabilities": [{"value": i, "label": o, "probability": q}
                              for i, (o, q) in enumerate(zip(question.options, p))],
            "confidence": read.confidence}


Conversation = list[dict[str, Any]]


def systemone_request(request: SystemOneRequest) -> tuple[list[Question], Conversation]:
    """The questions and the conversation PCD reads: the instructions as a system turn, then
    the state as the user's."""
    media = sorted(n for n, v in (("audio", request.audio), ("image", request.images),
                                  ("video", request.videos)) if v)
    if media:
        raise SchemaError(f"this model does not take {', '.join(media)} inputs",
                          param=media[0], rule="media")
    if not request.questions:
        raise SchemaError("questions: needs at least one question", param="questions")
    questions = []
    for qid, spec in request.questions.items():
        if spec.model_extra:
            raise SchemaError(f"question {qid!r}: unknown field(s) {sorted(spec.model_extra)}",
                              param="questions", rule="question")
        questions.append(systemone_question(qid, spec.type, spec.instructions, spec.criteria))
    messages = [{"role": "system", "content": request.instructions}] if request.instructions \
        else []
    return questions, [*messages, {"role": "user", "content": state_text(request.state)}]


def systemone_response(base_id: str, model: str, questions: Sequence[Question],
                       reads: Sequence[Read], tokens_read: int) -> dict[str, Any]:
    """vLLM's response, key for key. `usage` counts every token the model read once (vLLM
    counts each question's whole prompt), and one output token per decision."""
    return {
        "id": f"decision-{base_id}",
        "object": "structured_decision",
        "created": int(time.time()),
        "model": model,
        "answers": {q.id: systemone_answer(q, r) for q, r in zip(questions, reads)},
        "usage": {"input_tokens": tokens_read, "output_tokens": len(questions)},
        "diagnostics": {q.id: {"label_mass": r.label_mass, "argmax_is_label": r.argmax_is_label}
                        for q, r in zip(questions, reads)},
    }


def decisions_request(request: DecisionsRequest) -> tuple[list[Question], Conversation]:
    keys: set[str] = set()
    questions = []
    for i, q in enumerate(request.questions):
        options = ([(c.value, c.description) for c in q.choices] if q.type == "choice" else
                   [(lv.label, lv.description) for lv in q.levels] if q.type == "score" else [])
        questions.append(decisions_question(i, q.type, q.name, q.instructions, options, keys))
    return questions, [{"role": "user", "content": request.input_text()}]


def decisions_response(model: str, questions: Sequence[Question], reads: Sequence[Read],
                       tokens_read: int, tokens_computed: int) -> dict[str, Any]:
    """vLLM 0.33's response, key for key (its model forbids any other key). Cached tokens:
    those read but not computed."""
    cached = tokens_read - min(tokens_read, tokens_computed)
    return {
        "model": model,
        "answers": [decisions_answer(q, r) for q, r in zip(questions, reads)],
        "usage": {"input_tokens": tokens_read,
                  "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
                  "output_tokens": len(questions),
                  "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": tokens_read + len(questions)},
    }
