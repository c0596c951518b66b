"""The public evaluation's task list in one place: the sources, the sample each gets, and which
of them any choice of this project was made on.

    python -m benchmarks.evaluate --data $(python -m benchmarks.tasks untouched) \
        --limit 40 --sample balanced

Every source is a `benchmarks.public_data` name; every sample is drawn with `public_data.SEED`.
A task is *tuned* where a default (formulation, layout, decision) was chosen while looking at
its results, *seen* where earlier measurements of this project looked at it, and *untouched*
where neither happened before the decision rule in docs/accuracy.md was written. A default
changes only on what the untouched tasks say.
"""

from __future__ import annotations

import argparse

CASES_PER_TASK = 40  # label-balanced draw per task (as many of each gold answer)
NATURAL_CASES = 80   # natural draw, for the tasks whose label mix is skewed
TUNED = ["dev"]
SEEN = ["rotten_tomatoes", "bbc", "rotten_tomatoes_multi", "bbc_multi"]
# BIG-Bench Hard tasks whose questions a finite-choice field carries; a task joins the pooled
# comparison only where AR JSON's balanced accuracy is above chance by its 95% interval (a
# test on the baseline alone), the others are reported apart.
BBH = ["bbh:sports_understanding", "bbh:navigate", "bbh:web_of_lies", "bbh:causal_judgement",
       "bbh:formal_fallacies", "bbh:snarks", "bbh:hyperbaton", "bbh:disambiguation_qa",
       "bbh:date_understanding"]
UNTOUCHED_SINGLE = ["sick", "sms_spam", *BBH]
UNTOUCHED_MULTI = ["sick_multi"]
UNTOUCHED = UNTOUCHED_SINGLE + UNTOUCHED_MULTI
SKEWED = ["sms_spam", "sick"]  # natural label shares far from even: also drawn naturally

GROUPS = {"tuned": TUNED, "seen": SEEN, "untouched": UNTOUCHED, "bbh": BBH,
          "untouched_single": UNTOUCHED_SINGLE, "multi": UNTOUCHED_MULTI + SEEN[2:],
          "skewed": SKEWED}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tasks",
                                     description="print a group of evaluation sources")
    parser.add_argument("group", choices=sorted(GROUPS))
    print(" ".join(GROUPS[parser.parse_args(argv).group]))


if __name__ == "__main__":
    main()
