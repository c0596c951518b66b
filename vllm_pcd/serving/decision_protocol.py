"""The request bodies of vLLM's decision routes, field for field, as pydantic models of our
own (no supported vLLM has both: `/v1/systemone` came in 0.32, `/v1/decisions` in 0.33), so
a client written for vLLM's endpoints is validated the same way on every version we serve.

`/v1/systemone` (vLLM 0.32) ignores unknown top-level keys and refuses unknown question keys;
`/v1/decisions` (vLLM 0.33) refuses unknown keys everywhere.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, model_validator

# vLLM 0.33's bounds on text fields (characters)
_SHORT = 1 << 20
_LONG = 10 << 20


class SystemOneQuestion(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    instructions: Any = ""
    criteria: Any = None


class SystemOneRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    state: Any = Field(..., description="What the questions are about: text or JSON.")
    questions: dict[str, SystemOneQuestion] = Field(
        ..., description="Question id to question, asked in this order.")
    instructions: str | None = Field(default=None, description="A system turn ahead of all.")
    images: list[str] | None = None
    audio: list[str] | None = None
    videos: list[str] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    cache_salt: Any = None  # checked by `decisions.check_cache_salt`, with vLLM's message
    priority: int = Field(default=0, ge=-(2 ** 63), le=2 ** 63 - 1)
    request_id: str = Field(default_factory=lambda: f"{uuid.uuid4().int & (2 ** 64 - 1):016x}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


ShortText = Annotated[StrictStr, Field(max_length=_SHORT)]
LongText = Annotated[StrictStr, Field(max_length=_LONG)]


class InputText(_Strict):
    type: Literal["input_text"]
    text: LongText


class InputMessage(_Strict):
    role: Literal["user"]
    content: LongText | Annotated[list[InputText], Field(max_length=16384)]
    type: Literal["message"] = "message"

    @model_validator(mode="before")
    @classmethod
    def text_only(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("content"), list) and any(
                isinstance(part, dict) and part.get("type") == "input_image"
                for part in data["content"]):
            raise ValueError("Decisions supports text input only; images are not supported")
        return data


class _Question(_Strict):
    instructions: ShortText
    name: ShortText | None = None

    @model_validator(mode="after")
    def named_with_text(self) -> "_Question":
        if "name" in self.model_fields_set and self.name is None:
            raise ValueError("name must be a string when provided")
        return self


class Predicate(_Question):
    type: Literal["predicate"]


class Choice(_Strict):
    value: StrictStr | StrictBool
    description: ShortText = ""


class ChoiceQuestion(_Question):
    type: Literal["choice"]
    choices: list[Choice] = Field(min_length=2, max_length=255)

    @model_validator(mode="after")
    def distinct(self) -> "ChoiceQuestion":
        values = [(type(c.value), c.value) for c in self.choices]
        if len(set(values)) != len(values):
            raise ValueError("choice values must be distinct")
        return self


class Level(_Strict):
    label: ShortText
    description: ShortText = ""


class ScoreQuestion(_Question):
    type: Literal["score"]
    levels: list[Level] = Field(min_length=2, max_length=10)


AnyQuestion = Annotated[Predicate | ChoiceQuestion | ScoreQuestion, Field(discriminator="type")]


class DecisionsRequest(_Strict):
    model: ShortText
    input: LongText | Annotated[list[InputMessage], Field(max_length=131072)]
    questions: list[AnyQuestion] = Field(min_length=1, max_length=200)
    safety_identifier: Annotated[StrictStr, Field(max_length=128)] | None = None
    joint: StrictBool = False
    cache_salt: Any = None  # checked by `decisions.check_cache_salt`, with vLLM's message

    def input_text(self) -> str:
        """Every message folded into one text, as vLLM does: parts joined by newlines,
        messages by blank lines."""
        if isinstance(self.input, str):
            return self.input
        return "\n\n".join(m.content if isinstance(m.content, str)
                           else "\n".join(part.text for part in m.content) for m in self.input)
