"""Labelled public sets read in place from a data folder (default `../shared/data` beside the
repository, or `PCD_DATA`): SICK entailment, the SMS Spam Collection and BIG-Bench Hard. Never
copied into the repository; a missing folder is a clear error naming it.

    python -m benchmarks.evaluate --data sick sms_spam bbh:navigate --limit 100 --balanced

Sources: `sick` (one sentence pair, entailment / neutral / contradiction), `sick_multi` (three
pairs in one message), `sms_spam` (whether a text message is spam), `bbh:<task>` (its
yes/no, true/false or valid/invalid questions as a boolean field; its `(A)`-style choices as
an enum of the options' texts).
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any, Iterator

from benchmarks.public_data import _grouped, boolean, case, data_folder, enum

SICK_LABELS = ["entailment", "neutral", "contradiction"]
_YES_NO = {"yes": True, "no": False, "true": True, "false": False, "valid": True,
           "invalid": False}
_ASKED = {"yes": "yes", "no": "yes", "true": "true", "false": "true", "valid": "valid",
          "invalid": "valid"}  # the word the boolean field asks about
_CHOICE = re.compile(r"^\(([A-R])\)\s*(.+)$")


def folder() -> Path:
    """The data folder, or an error saying where it was looked for and how to point at it."""
    path = data_folder()
    if not path.is_dir():
        raise FileNotFoundError(f"no labelled data at {path}: set PCD_DATA to the folder "
                                "holding sick2014/, sms-spam/ and bbh/ (../shared/data.md)")
    return path


def sick_rows(split: str = "SICK_test_annotated.txt") -> list[tuple[str, str, str]]:
    with open(folder() / "sick2014" / split, newline="") as f:
        return [(r["sentence_A"], r["sentence_B"], r["entailment_judgment"].lower())
                for r in csv.DictReader(f, delimiter="\t")]


def sick() -> Iterator[dict[str, Any]]:
    for k, (a, b, label) in enumerate(sick_rows()):
        yield case("sick", k, f"Sentence A: {a}\nSentence B: {b}",
                   {"relation": enum(SICK_LABELS, "Whether sentence A entails sentence B, "
                                     "contradicts it, or neither (neutral)")},
                   {"relation": label})


def sick_multi() -> Iterator[dict[str, Any]]:
    rows = [(f"A: {a} / B: {b}", label) for a, b, label in sick_rows()]
    yield from _grouped("sick_multi", rows, "Pair", "pair_{k}_relation",
                        lambda k: enum(SICK_LABELS, f"Whether in pair {k} sentence A entails "
                                       "sentence B, contradicts it, or neither (neutral)"))


def sms_spam() -> Iterator[dict[str, Any]]:
    with open(folder() / "sms-spam" / "SMSSpamCollection", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    for k, row in enumerate(rows):
        yield case("sms_spam", k, row["SMS"],
                   {"is_spam": boolean("Whether this text message is unsolicited spam "
                                       "(advertising, prizes, scams)")},
                   {"is_spam": row["Label"] == "spam"})


def bbh(task: str) -> Iterator[dict[str, Any]]:
    """A BBH task's examples a finite-choice field can ask: yes/no-like targets as a boolean,
    lettered choices as an enum of their texts (the question, without its option lines, as
    the message)."""
    examples = json.loads((folder() / "bbh" / f"{task}.json").read_text())["examples"]
    for k, example in enumerate(examples):
        text, target = example["input"], example["target"].strip()
        question = text.split("\nOptions:")[0]
        if target.lower() in _YES_NO:
            word = _ASKED[target.lower()]
            yield case(f"bbh:{task}", k, question, {"answer": boolean(
                f"Whether the answer to the question is {word}")},
                {"answer": _YES_NO[target.lower()]})
            continue
        choices = dict(m.groups() for line in text.splitlines()
                       if (m := _CHOICE.match(line.strip())))
        letter = target.strip("()")
        texts = [t.strip() for t in choices.values()]
        if letter not in choices or len(set(texts)) != len(texts) \
                or any(len(t) > 200 for t in texts):
            continue  # not a finite choice a schema can carry
        yield case(f"bbh:{task}", k, question, {"answer": enum(
            texts, "The answer to the question")}, {"answer": choices[letter].strip()})


SOURCES = {"sick": sick, "sick_multi": sick_multi, "sms_spam": sms_spam}
