"""Sequence mode: whole serialized candidates, jointly tokenized, scored over a trie."""

import math

import pytest
import torch

from tests.conftest import MESSAGE
from tests.helpers import SPLIT, SPLIT_MESSAGE, TOLERANCE
from vllm_pcd import constrained
from vllm_pcd.engine import TRIE_ENV, schedule
from vllm_pcd.core.plan import (FieldPlan, Options, SequenceFieldPlan, build_plan,
                                build_sequence_field, serialize)
from vllm_pcd.core.schema import FieldSpec, Limits, SchemaError, parse_schema
from vllm_pcd.core.scoring import edge_logprobs

TRICKY = {
    "type": "object",
    "properties": {
        "payment_method": {"enum": ["credit_card", "credit_transfer", "debit_card", "paypal"]},
        "status": {"enum": ["open 1", "open 2", "Closed", "not mentioned"],
                   "description": "Ticket status"},
        "language": {"enum": ["English", "Español", "日本語"]},
        "refund_requested": {"type": "boolean"},
    },
    "required": ["payment_method", "status", "language", "refund_requested"],
    "additionalProperties": False,
}


def test_serialized_candidates_end_with_a_newline():
    assert serialize("billing") == ' "billing"\n'
    assert serialize(True) == " true\n"
    assert serialize("Español") == ' "Español"\n'


def standalone(tokenizer):
    """Continuations tokenized as texts of their own (the context is empty)."""
    return lambda text: tuple(tokenizer.encode(text, add_special_tokens=False))


def test_trie_scores_each_shared_token_once(tokenizer):
    field = FieldSpec("payment_method", "enum", ("credit_card", "credit_transfer", "paypal"))
    plan = build_sequence_field(standalone(tokenizer), field, "payment_method:")
    for seq, start in zip(plan.candidates, plan.score_from):
        assert tokenizer.decode(list(seq[start:])) == serialize(field.options[plan.candidates.index(seq)])
    edges = {(n.prefix, c) for n in plan.nodes for c in n.children}
    needed = {(seq[:j], seq[j]) for seq, s in zip(plan.candidates, plan.score_from)
              for j in range(s, len(seq))}
    assert edges == needed  # every scored edge appears in exactly one node
    assert len(edges) == sum(len(n.children) for n in plan.nodes)
    assert sum(n.units for n in plan.nodes) == 3
    shared_first = plan.candidates[0][plan.score_from[0]]
    assert shared_first == plan.candidates[1][plan.score_from[1]]  # ' "' or ' "credit'


def test_candidates_are_tokenized_with_their_stem(tokenizer):
    field = FieldSpec("x", "enum", ("a", "b"))
    plan = build_sequence_field(standalone(tokenizer), field, "x:")
    for option, seq in zip(field.options, plan.candidates):
        assert list(seq) == tokenizer.encode("x:" + serialize(option), add_special_tokens=False)


def test_mixed_modes_in_one_plan(tokenizer):
    raw = dict(TRICKY)
    raw["properties"] = dict(TRICKY["properties"])
    raw["properties"]["refund_requested"] = {"type": "boolean", "x-pcd-mode": "token"}
    plan = build_plan(tokenizer, parse_schema(raw), [{"role": "user", "content": MESSAGE}],
                      Options(mode="sequence", formulation="codes"))
    kinds = [type(fp) for fp in plan.fields]
    assert kinds == [SequenceFieldPlan] * 3 + [FieldPlan]
    text = tokenizer.decode(list(plan.shared_ids))
    assert '"credit_card", "credit_transfer"' in text and "refund_requested: true, false" in text


def test_value_token_limit_is_checked_before_inference(tokenizer):
    raw = {"type": "object", "required": ["x"], "additionalProperties": False,
           "properties": {"x": {"enum": ["word " * 40, "short"]}}}
    with pytest.raises(SchemaError) as info:
        build_plan(tokenizer, parse_schema(raw), [{"role": "user", "content": "hi"}],
                   Options(mode="sequence"), Limits(max_value_tokens=16))
    assert info.value.rule == "max_value_tokens"


def reference_token_logprobs(model, shared, plan: SequenceFieldPlan):
    """Per candidate, the FP32 full-forward log-probability of each scored token."""
    out = []
    for seq, start in zip(plan.candidates, plan.score_from):
        ids = list(shared) + list(seq)
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
        offset = len(shared)
        out.append([logp[offset + j - 1, seq[j]].item() for j in range(start, len(seq))])
    return out


def engine_token_logprobs(result, field_index):
    fp = result.plan.fields[field_index]
    results = [r.logprobs for s, r in zip(result.plan.scorings, result.execution.branches)
               if s.field_index == field_index]
    edges = edge_logprobs(fp.nodes, results)
    return [[edges[(seq[:j], seq[j])] for j in range(start, len(seq))]
            for seq, start in zip(fp.candidates, fp.score_from)]


@pytest.mark.parametrize("trie", ["chained", "flat"])
def test_sequence_scores_match_fp32_reference(fp32_llm, reference_model, monkeypatch, trie):
    """Every scored token's log-probability within 1e-4 of the FP32 full forward; a sum of n
    tokens within n·1e-4 (FP32 rounding differences add up along a candidate). Chained, each trie token is computed once, one call per trie level;
    flat, every node runs in one call and recomputes its path."""
    monkeypatch.setenv(TRIE_ENV, trie)
    result = constrained(fp32_llm, MESSAGE, TRICKY, mode="sequence",
                         cache_salt=f"seq-fidelity-{trie}")
    diag = result.diagnostics()
    assert diag["mode"] == "sequence"
    calls = result.execution.backbone_calls
    scorings = result.plan.scorings
    if trie == "chained":
        assert diag["tokens"]["computed"] == diag["tokens"]["ideal"]
        assert calls == 1 + len(schedule(scorings, Limits().max_branches_per_batch, True))
    else:
        total_candidates = sum(len(p["enum"]) if "enum" in p else 2
                               for p in TRICKY["properties"].values())
        assert calls <= 1 + math.ceil(total_candidates / 32)
    for i, (fp, fr) in enumerate(zip(result.plan.fields, result.fields)):
        expected = reference_token_logprobs(reference_model, result.plan.shared_ids, fp)
        got_tokens = engine_token_logprobs(result, i)
        worst = max(abs(a - b) for g, e in zip(got_tokens, expected) for a, b in zip(g, e))
        assert worst < TOLERANCE, f"{fp.field.name}: {got_tokens} vs {expected}"
        sums = [c["logprob_sum"] for c in fr.diagnostics()["candidates"]]
        for total, tokens, ref in zip(sums, got_tokens, expected):
            assert total == pytest.approx(sum(tokens), abs=1e-12)
            assert abs(total - sum(ref)) < TOLERANCE * len(ref), f"{fp.field.name}"
        assert fr.value == fp.field.options[max(range(len(sums)), key=sums.__getitem__)]


def reference_greedy(model, shared, plan: SequenceFieldPlan) -> tuple[int, float]:
    """The option a constrained left-to-right decoder takes, walking the field's token trie
    on an FP32 full forward: at each token where the options part, the most probable of the
    allowed tokens. Also the smallest gap it decided by (to tell a near tie)."""
    logp = reference_token_logprobs(model, shared, plan)
    alive, gap = list(range(len(plan.candidates))), math.inf
    for j in range(max(map(len, plan.candidates))):
        here = {plan.candidates[i][j]: i for i in alive if j < len(plan.candidates[i])}
        if len(here) < 2:
            continue
        token_logp = {t: logp[i][j - plan.score_from[i]] for t, i in here.items()}
        ranked = sorted(token_logp.values(), reverse=True)
        gap = min(gap, ranked[0] - ranked[1])
        best = max(token_logp, key=token_logp.__getitem__)
        alive = [i for i in alive if j < len(plan.candidates[i]) and plan.candidates[i][j] == best]
    assert len(alive) == 1
    return alive[0], gap


@pytest.mark.parametrize("message, schema, splits", [(MESSAGE, TRICKY, 0), (SPLIT_MESSAGE, SPLIT, 1)])
def test_greedy_decisions_follow_the_fp32_constrained_greedy_path(fp32_llm, reference_model,
                                                                  message, schema, splits):
    """`pcd_decision: greedy` answers what a constrained greedy decoder writes: on the
    restricted head a group of options is its shared token's probability, token for token.
    `splits` fields answer otherwise under `most_probable`."""
    greedy = constrained(fp32_llm, message, schema, decision="greedy", cache_salt="greedy")
    default = constrained(fp32_llm, message, schema, decision="most_probable",
                          cache_salt="greedy")
    assert [f.value for f in constrained(fp32_llm, message, schema).fields] == [
        f.value for f in greedy.fields]  # greedy is the token mode's default
    shared_first = 0
    for fp, fr in zip(greedy.plan.fields, greedy.fields):
        if not isinstance(fp, SequenceFieldPlan):
            continue
        index, gap = reference_greedy(reference_model, greedy.plan.shared_ids, fp)
        assert gap > 10 * TOLERANCE, f"{fp.field.name}: a near tie ({gap})"
        assert fr.value == fp.field.options[index], fp.field.name
        shared_first += len({c[s] for c, s in zip(fp.candidates, fp.score_from)}) < len(
            fp.candidates)
    assert shared_first >= 1  # `credit_…`, `open …`, `billing_…` share their first token
    assert sum(g.value != d.value for g, d in zip(greedy.fields, default.fields)) == splits
    assert [g.scores for g in greedy.fields] == [d.scores for d in default.fields]


def test_mean_normalisation_divides_by_value_tokens(fp32_llm):
    result = constrained(fp32_llm, MESSAGE, TRICKY, mode="sequence", normalization="mean")
    for fr in result.fields:
        for c in fr.diagnostics()["candidates"]:
            assert c["normalized"] == pytest.approx(c["logprob_sum"] / c["tokens"])


def test_a_node_s_children_renormalised_together_across_its_chunks():
    from vllm_pcd.core.scoring import Node, among_children
    nodes = [Node((1,), (5, 6), 2), Node((1,), (7,), 1), Node((1, 5), (9,), 1)]
    results = [{5: math.log(0.2), 6: math.log(0.1)}, {7: math.log(0.1)}, {9: math.log(0.5)}]
    raw = edge_logprobs(nodes, results)
    among = among_children(raw)
    assert raw[((1,), 5)] == pytest.approx(math.log(0.2))
    assert [math.exp(among[((1,), t)]) for t in (5, 6, 7)] == pytest.approx([0.5, 0.25, 0.25])
    assert among[((1, 5), 9)] == pytest.approx(0.0)  # a lone child is certain
