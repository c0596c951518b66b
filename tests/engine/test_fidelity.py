"""PCD's scores against an independent reference: a plain transformers FP32 forward pass over
the whole branch text (no KV cache), renormalised over the allowed codes."""

import math

import pytest
import torch

from tests.conftest import MESSAGE, SIX_FIELD_SCHEMA, SUPPORT_SCHEMA
from tests.helpers import SYSTEMONE, TOLERANCE, reference_candidate_sums, reference_scores
from vllm_pcd import constrained
from vllm_pcd.serving.decision_protocol import SystemOneRequest
from vllm_pcd.serving.decisions import Read, systemone_answer, systemone_request, to_schema

pytestmark = pytest.mark.vllm024  # runs on vLLM 0.24 (FlagOS hosts) too


@pytest.mark.parametrize("schema", [SUPPORT_SCHEMA, SIX_FIELD_SCHEMA], ids=["2-field", "6-field"])
def test_code_scores_match_fp32_reference(fp32_llm, reference_model, schema):
    result = constrained(fp32_llm, MESSAGE, schema, formulation="codes")
    assert result.execution.backbone_calls == 2
    for i, (fp, fr) in enumerate(zip(result.plan.fields, result.fields)):
        expected = reference_scores(reference_model, result.plan.branch_ids(i), fp.code_ids)
        worst = max(abs(a - b) for a, b in zip(fr.scores, expected))
        assert worst < TOLERANCE, f"{fp.field.name}: {fr.scores} vs {expected}"
        assert math.isclose(sum(math.exp(s) for s in fr.scores), 1.0, rel_tol=1e-9)
    assert set(result.object) == set(schema["properties"])


def test_long_context_reuses_cached_prefix(fp32_llm, reference_model):
    """A shared context over one KV block: branches read its full blocks from the cache."""
    text = MESSAGE + " " + "The order number is 1234 and I paid by card last week. " * 30
    result = constrained(fp32_llm, text, SUPPORT_SCHEMA, cache_salt="long-context",
                         formulation="codes")
    shared = len(result.plan.shared_ids)
    assert shared > 256
    cached = [b.cached_tokens for b in result.execution.branches]
    assert all(c >= shared - shared % 128 - 128 and c > 0 for c in cached), cached
    fp = result.plan.fields[0]
    expected = reference_scores(reference_model, result.plan.branch_ids(0), fp.code_ids)
    assert max(abs(a - b) for a, b in zip(result.fields[0].scores, expected)) < TOLERANCE


@pytest.mark.parametrize("schema", [SUPPORT_SCHEMA, SIX_FIELD_SCHEMA], ids=["2-field", "6-field"])
def test_json_first_token_scores_match_fp32_reference(fp32_llm, reference_model, schema):
    """The default formulation: each value scored by its real tokens up to where it is
    unique, continuing the assistant's own JSON object."""
    result = constrained(fp32_llm, MESSAGE, schema)
    assert result.execution.backbone_calls == 2
    for fp, fr in zip(result.plan.fields, result.fields):
        sums = reference_candidate_sums(reference_model, result.plan.shared_ids, fp)
        expected = (torch.tensor(sums) - torch.logsumexp(torch.tensor(sums), 0)).tolist()
        worst = max(abs(a - b) for a, b in zip(fr.scores, expected))
        assert worst < TOLERANCE, f"{fp.field.name}: {fr.scores} vs {expected}"


def test_a_decision_request_matches_the_fp32_reference(fp32_llm, reference_model):
    """A `/v1/systemone` body (yes/no, choice, score) mapped as the route maps it and scored
    on the full LM head: each answer's probabilities and its label mass (the options' share
    of the whole vocabulary) against the FP32 forward."""
    questions, messages = systemone_request(SystemOneRequest.model_validate(SYSTEMONE))
    result = constrained(fp32_llm, messages, to_schema(questions), full_vocabulary=True)
    assert result.execution.backbone_calls == 2
    assert not any(b.restricted for b in result.execution.branches)
    for q, fp, fr in zip(questions, result.plan.fields, result.fields):
        read = Read.of(q, fr.field.options, fr.scores, fr.extra)
        sums = torch.tensor(reference_candidate_sums(reference_model, result.plan.shared_ids, fp))
        expected = torch.softmax(sums, 0).tolist()
        assert max(abs(a - b) for a, b in zip(read.probabilities, expected)) < TOLERANCE, q.id
        assert abs(read.label_mass - sums.exp().sum().item()) < TOLERANCE, q.id
        assert 0 < read.label_mass < 1
        answer = systemone_answer(q, read)
        assert answer["confidence"] == pytest.approx(max(expected) * read.label_mass, abs=TOLERANCE)


def test_a_list_of_documents_is_batched_and_each_matches_the_reference(fp32_llm, reference_model):
    """`constrained(llm, texts, schema)` submits every document at once: all shared contexts
    run in one engine step, then all branches in one more, and each document's scores still
    match the FP32 reference of its own branches."""
    texts = [MESSAGE, "My parcel never arrived and tracking shows nothing.",
             "How do I change the e-mail address on my account?"]
    results = constrained(fp32_llm, texts, SUPPORT_SCHEMA, formulation="codes",
                          cache_salt="batch-of-three")
    assert len(results) == 3
    steps = [{r.execution.prefill.step_ts for r in results},
             {b.step_ts for r in results for b in r.execution.branches}]
    assert [len(s) for s in steps] == [1, 1], steps
    for text, result in zip(texts, results):
        for i, (fp, fr) in enumerate(zip(result.plan.fields, result.fields)):
            expected = reference_scores(reference_model, result.plan.branch_ids(i), fp.code_ids)
            assert max(abs(a - b) for a, b in zip(fr.scores, expected)) < TOLERANCE
    assert constrained(fp32_llm, texts[1], SUPPORT_SCHEMA, formulation="codes").object \
        == results[1].object


def test_the_offline_prior_is_the_schemas_answer_about_an_empty_document(fp32_llm):
    """Offline, the prior computed beside a batch is what the same schema answers about the
    content-free text on its own."""
    results = constrained(fp32_llm, [MESSAGE, "Where is my parcel?"], SUPPORT_SCHEMA,
                          calibration="content_free", cache_salt="offline-prior")
    alone = constrained(fp32_llm, "N/A", SUPPORT_SCHEMA, cache_salt="offline-prior-alone")
    assert [r.calibration["prior_cached"] for r in results] == [False, False]
    for result in results:
        for calibrated, empty in zip(result.fields, alone.fields):
            priors = [c["prior_score"] for c in calibrated.diagnostics()["candidates"]]
            assert priors == pytest.approx(list(empty.scores), abs=TOLERANCE)
    again = constrained(fp32_llm, MESSAGE, SUPPORT_SCHEMA, calibration="content_free",
                        cache_salt="offline-prior")
    assert again.calibration["prior_cached"] is True
    assert again.object == results[0].object


def test_documents_with_different_system_turns_get_their_own_priors(fp32_llm):
    chats = [[{"role": "system", "content": system}, {"role": "user", "content": MESSAGE}]
             for system in ("You are a billing assistant.", "Answer tersely.")]
    results = constrained(fp32_llm, chats, SUPPORT_SCHEMA, calibration="content_free",
                          cache_salt="two-system-turns")
    for chat, result in zip(chats, results):
        alone = constrained(fp32_llm, [chat[0], {"role": "user", "content": "N/A"}],
                            SUPPORT_SCHEMA, cache_salt="two-system-turns-alone")
        priors = [c["prior_score"] for c in result.fields[1].diagnostics()["candidates"]]
        assert priors == pytest.approx(list(alone.fields[1].scores), abs=TOLERANCE)
    assert results[0].fields[1].diagnostics()["candidates"][0]["prior_score"] != \
        results[1].fields[1].diagnostics()["candidates"][0]["prior_score"]
