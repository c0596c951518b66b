"""PCD's scores against an independent reference: a plain transformers FP32 forward pass over
the whole branch text (no KV cache), renormalised over the allowed codes."""

import math

import pytest
import torch

from tests.conftest import MESSAGE, SIX_FIELD_SCHEMA, SUPPORT_SCHEMA
from vllm_pcd import constrained

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def reference_model(model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    return model.eval()


def reference_scores(model, ids, code_ids):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1].double()
    allowed = torch.log_softmax(logits, -1)[list(code_ids)]
    return (allowed - torch.logsumexp(allowed, 0)).tolist()


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
        sums = []
        for seq, start in zip(fp.candidates, fp.score_from):
            ids = [*result.plan.shared_ids, *seq]
            with torch.no_grad():
                logp = torch.log_softmax(reference_model(torch.tensor([ids])).logits[0].double(), -1)
            offset = len(result.plan.shared_ids)
            sums.append(sum(logp[offset + j - 1, seq[j]].item() for j in range(start, len(seq))))
        expected = (torch.tensor(sums) - torch.logsumexp(torch.tensor(sums), 0)).tolist()
        worst = max(abs(a - b) for a, b in zip(fr.scores, expected))
        assert worst < TOLERANCE, f"{fp.field.name}: {fr.scores} vs {expected}"
