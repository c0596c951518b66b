"""vLLM's own structured-decisions read (0.32's `/v1/systemone` for Qwen3-family models),
rebuilt on the completions API so that it runs on any model and can be compared with PCD on
the same cases.

One prompt per question: the state, a blank line, `Question: <instructions>`, one labelled
line per option (letters A-Z for a choice, `yes`/`no` for a boolean) and a reply
instruction, as the user turn after any system turns, rendered by the chat template with
thinking off. The label tokens are read as the reply's first token and the best one wins.
"""

from __future__ import annotations

import string
from typing import Any, Iterator

from vllm_pcd.core.schema import FieldSpec, SchemaSpec

LETTERS = string.ascii_uppercase


def question_text(field: FieldSpec, instructions: str | None) -> tuple[str, list[str]]:
    """The question as vLLM writes it after the state, and its labels in option order."""
    if field.kind == "boolean":
        labels, lines, reply = ["yes", "no"], ["yes", "no"], "Answer with yes or no only."
    else:
        if len(field.options) > len(LETTERS):
            raise ValueError(f"{field.name}: more options than letters")
        labels = list(LETTERS[:len(field.options)])
        lines = [f"{label}: {option}" for label, option in zip(labels, field.options)]
        reply = "Answer with the letter of one option only."
    head = [f"Question: {instructions}"] if instructions else []
    return "\n".join([*head, *lines, reply]), labels


def letter_prompts(tokenizer: Any, messages: list[dict[str, Any]], spec: SchemaSpec
                   ) -> Iterator[tuple[list[int], list[int]]]:
    """(prompt ids, one token id per label) for each field; ValueError where a label is not
    one token after the prompt, where vLLM's endpoint refuses the model too."""
    system = [m for m in messages if m["role"] == "system"]
    state = "\n\n".join(m["content"] for m in messages if m["role"] != "system")
    for field in spec.fields:
        text, labels = question_text(field, field.description)
        conversation = [*system, {"role": "user", "content": f"{state}\n\n{text}"}]
        prompt = tokenizer.apply_chat_template(conversation, add_generation_prompt=True,
                                               tokenize=False, enable_thinking=False)
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        label_ids = []
        for label in labels:
            extended = tokenizer.encode(prompt + label, add_special_tokens=False)
            if extended[:-1] != ids or extended[-1] in label_ids:
                raise ValueError(f"label {label!r} is not one distinct token after the prompt")
            label_ids.append(extended[-1])
        yield ids, label_ids
