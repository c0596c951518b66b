"""The one round rule both paths drive (`core.result.CallRounds`), against a scripted engine:
conditioned fields wait for the values they read, a content-free prior rides along with the
first round once per distinct system turn, and a cached prior is not run again."""

import pytest

from vllm_pcd.core.plan import Options, build_plan
from vllm_pcd.core.result import CallRounds
from vllm_pcd.core.schema import parse_schema
from vllm_pcd.core.scoring import Execution, PriorCache, RequestReport
from tests.helpers import closed

CONDITIONED = parse_schema(closed({"kind": {"enum": ["billing", "outage"]},
                                   "urgent": {"type": "boolean", "x-pcd-after": ["kind"]}}))
PLAIN = parse_schema(closed({"urgent": {"type": "boolean"}}))


def user(text, system=None):
    return [*([{"role": "system", "content": system}] if system else []),
            {"role": "user", "content": text}]


def engine(plan, favoured=0):
    """Every scoring's `favoured` allowed token far ahead of the others."""
    branches = tuple(RequestReport(1, 0, None, {t: (-0.01 if i == favoured else -5.0)
                                                for i, t in enumerate(s.token_ids)})
                     for s in plan.scorings)
    return Execution(RequestReport(len(plan.shared_ids), 0, None, {}), branches, 0.0, 0.0)


def drive(call, tokenizer, spec, options, favoured=lambda ask: 0):
    """What `pipeline` does, without an engine; returns each round's asks."""
    seen = []
    while not call.complete:
        asks = call.asks()
        seen.append(asks)
        plans = [build_plan(tokenizer, spec, a.conversation, options, answered=a.answered)
                 for a in asks]
        run = call.to_run(plans)
        call.add([engine(plan, favoured(ask)) for ask, plan in run])
    return seen


def test_a_conditioned_field_takes_a_later_round_reading_the_first(tokenizer):
    options = Options()
    call = CallRounds(options, [user("The app is down."), user("I was charged twice.")],
                      PriorCache())
    rounds = drive(call, tokenizer, CONDITIONED, options)
    assert [[(a.document, a.round, a.suffix) for a in r] for r in rounds] == [
        [(0, 0, ""), (1, 0, "")], [(0, 1, "-r1"), (1, 1, "-r1")]]
    assert rounds[1][0].answered.values == {"kind": "billing"}
    answers = call.answers(CONDITIONED, 0.0)
    assert [a.object for a in answers] == [{"kind": "billing", "urgent": True}] * 2
    assert answers[0].conditioned == {"urgent": {"kind": "billing"}}
    assert [len(a.rounds) for a in answers] == [2, 2]


def test_a_content_free_prior_is_asked_once_per_system_turn_and_then_cached(tokenizer):
    options = Options(calibration="content_free")
    docs = [user("a", "Be brief."), user("b", "Be brief."), user("c", "Be kind.")]
    priors = PriorCache()
    # the prior leans to `false` (option 1), the documents to `true`
    first = CallRounds(options, docs, priors)
    rounds = drive(first, tokenizer, PLAIN, options,
                   favoured=lambda ask: 1 if ask.prior else 0)
    assert len(rounds) == 1
    assert [a.document for a in rounds[0]] == [0, 1, 2, None, None]
    assert [a.suffix for a in rounds[0]][3:] == ["-prior", "-prior"]
    assert [a.conversation[-1]["content"] for a in rounds[0][3:]] == ["N/A", "N/A"]
    answers = first.answers(PLAIN, 0.0)
    assert [a.calibration["prior_cached"] for a in answers] == [False] * 3
    assert all(a.object == {"urgent": True} for a in answers)

    again = CallRounds(options, docs[:1], priors)
    asks = again.asks()
    run = again.to_run([build_plan(tokenizer, PLAIN, a.conversation, options) for a in asks])
    assert [ask.document for ask, _ in run] == [0]  # the cached prior is not run
    again.add([engine(plan) for _, plan in run])
    assert again.answers(PLAIN, 0.0)[0].calibration["prior_cached"] is True


def test_no_prior_is_asked_without_content_free_calibration(tokenizer):
    call = CallRounds(Options(), [user("a", "Be brief.")], PriorCache())
    assert [a.document for a in call.asks()] == [0]


def test_reports_must_match_what_was_asked(tokenizer):
    options = Options()
    call = CallRounds(options, [user("a")], PriorCache())
    asks = call.asks()
    with pytest.raises(ValueError, match="1 asks, 0 plans"):
        call.to_run([])
    call.to_run([build_plan(tokenizer, PLAIN, a.conversation, options) for a in asks])
    with pytest.raises(ValueError, match="1 plans run, 2 reports"):
        call.add([None, None])
    with pytest.raises(ValueError, match="still has rounds"):
        call.answers(PLAIN, 0.0)
