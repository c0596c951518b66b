"""PCD's engine requests never change a neighbour's output, nor a neighbour PCD's scores.

Both kinds go into one `LLM.generate` call: every request is added before the engine steps,
so the first step schedules them all together. That is the mixed batch in which vLLM's
sampler hands every row the exact-id gather (`internals.sampler`), deterministically.
"""

import math

import pytest
from vllm import SamplingParams
from vllm.inputs import TokensPrompt

from tests.conftest import MESSAGE

pytestmark = pytest.mark.vllm024  # runs on vLLM 0.24 (FlagOS hosts) too

NEIGHBOUR = "The capital of France is"


def _alone(llm, prompt, params):
    (out,) = llm.generate([prompt], [params], use_tqdm=False)
    return out


def _steps(out):
    return out.metrics.first_token_ts if out.metrics is not None else None


def _scorer(ids):
    return SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=list(ids))


@pytest.mark.parametrize("top", [0, 5, 20, -1])  # -1: the full vocabulary
def test_top_logprobs_of_a_neighbour_survive_a_batch_with_exact_id_requests(fp32_llm, top):
    plain = SamplingParams(max_tokens=1, temperature=0.0, logprobs=top)
    alone = _alone(fp32_llm, NEIGHBOUR, plain).outputs[0].logprobs[0]
    wanted = top if top >= 0 else fp32_llm.llm_engine.model_config.get_vocab_size()
    assert len(alone) >= wanted and all(math.isfinite(v.logprob) for v in alone.values())
    exact = [TokensPrompt(prompt_token_ids=[1, 2, 3, 4 + k]) for k in range(2)]
    # The same batch with the other two asking for no log-probabilities: the model's numbers
    # are then the same (an FP32 GEMM's rounding depends on the batch's shape), so any
    # difference would be the sampler's mixing of exact-id and top-k rows.
    greedy = SamplingParams(max_tokens=1, temperature=0.0)
    same_batch = fp32_llm.generate([NEIGHBOUR, *exact], [plain, greedy, greedy],
                                   use_tqdm=False)[0].outputs[0].logprobs[0]
    outs = fp32_llm.generate([NEIGHBOUR, *exact], [plain, _scorer([5, 9]), _scorer([7])],
                             use_tqdm=False)
    assert len({_steps(o) for o in outs}) == 1, "the three requests must share one step"
    mixed = outs[0].outputs[0].logprobs[0]
    assert {t: v.logprob for t, v in mixed.items()} == pytest.approx(
        {t: v.logprob for t, v in same_batch.items()}, abs=1e-6)
    assert {t: v.rank for t, v in mixed.items()} == {t: v.rank for t, v in same_batch.items()}
    assert set(mixed) == set(alone)  # and the same tokens as alone
    for out, ids in zip(outs[1:], ([5, 9], [7])):
        assert set(ids) <= set(out.outputs[0].logprobs[0])


@pytest.mark.parametrize("restrict", [False, True], ids=["full-head", "restricted-head"])
def test_pcd_scores_do_not_move_when_a_neighbour_asks_for_many_logprobs(fp32_llm, restrict):
    """A real branch request (PCD's own params and tag) beside a neighbour asking for 20 top
    and 20 prompt log-probabilities: its scores equal those it gets alone."""
    from vllm_pcd.engine import branch_params

    prompt = TokensPrompt(prompt_token_ids=fp32_llm.get_tokenizer().encode(MESSAGE))
    branch = branch_params([5, 9, 11], restrict=restrict)
    alone = _alone(fp32_llm, prompt, branch).outputs[0].logprobs[0]
    greedy = SamplingParams(max_tokens=1, temperature=0.0, logprobs=20, prompt_logprobs=20)
    outs = fp32_llm.generate([NEIGHBOUR, prompt], [greedy, branch], use_tqdm=False)
    assert len({_steps(o) for o in outs}) == 1
    beside = outs[1].outputs[0].logprobs[0]
    for t in (5, 9, 11):
        assert beside[t].logprob == pytest.approx(alone[t].logprob, abs=1e-5)
    assert len(outs[0].outputs[0].logprobs[0]) >= 20
