"""The restricted LM head: PCD rows projected onto their allowed ids give the scores of the
full projection renormalised over those ids; untagged rows of the same batch stay stock."""

import math
from types import SimpleNamespace

import pytest
import torch
from vllm import SamplingParams
from vllm.inputs import TokensPrompt

from tests.conftest import MESSAGE, SIX_FIELD_SCHEMA, SUPPORT_SCHEMA
from tests.helpers import TOLERANCE, reference_scores
from vllm_pcd import constrained
from vllm_pcd.core.plan import Options, build_plan
from vllm_pcd.engine import branch_params
from vllm_pcd.internals import lm_head, tags
from vllm_pcd.pipeline import as_messages
from vllm_pcd.core.schema import parse_schema

pytestmark = pytest.mark.vllm024  # runs on vLLM 0.24 (FlagOS hosts) too

# Restricted vs full projection, both FP32 in one engine. The stock CPU head (oneDNN) is itself
# ~1.3e-5 from an FP64 projection on SmolLM2's logits (|logit| ~ 20), the gathered one ~5e-6,
# so scores from the two may differ by ~2e-5 through summation order alone.
SAME = 5e-5

# One field per case the engine must tell apart: single-request token fields (restricted),
# a token field whose values part over several trie nodes and a sequence-mode field.
MIXED_SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "enum": ["billing", "technical", "shipping"]},
        "refund_requested": {"type": "boolean"},
        "payment": {"type": "string", "enum": ["credit_card", "credit_note", "debit_card"]},
        "channel": {"type": "string", "enum": ["email", "phone"], "x-pcd-mode": "sequence"},
    },
    "required": ["topic", "refund_requested", "payment", "channel"],
    "additionalProperties": False,
}


def rows_restricted(run):
    """What `run()` returned and how many rows the restricted head projected meanwhile."""
    before = lm_head.STATS.rows
    out = run()
    return out, lm_head.STATS.rows - before


def run_pcd(llm, monkeypatch, schema, on, salt, **kwargs):
    monkeypatch.setenv(lm_head.ENV, "1" if on else "0")
    return rows_restricted(lambda: constrained(llm, MESSAGE, schema, cache_salt=salt, **kwargs))


def worst(a, b):
    return max(abs(x - y) for x, y in zip(a, b))


def test_engine_restricts_only_scores_renormalised_at_one_position(tokenizer):
    codes = build_plan(tokenizer, parse_schema(MIXED_SCHEMA), as_messages(MESSAGE),
                       Options(formulation="codes"))
    json = build_plan(tokenizer, parse_schema(MIXED_SCHEMA), as_messages(MESSAGE),
                      Options(formulation="json"))
    fields = [s.field_index for s in json.scorings]
    # the cases this test is about: values sharing leading tokens, a sequence-mode field, a
    # boolean scored with its terminator (three requests)
    assert fields.count(2) > 1 and fields.count(3) > 1 and fields.count(1) == 3
    assert [s.restricted for s in json.scorings] == [i == 0 for i in fields]
    assert [s.restricted for s in codes.scorings] == [s.field_index != 3 for s in codes.scorings]
    assert tags.check(branch_params([5, 7], restrict=True).extra_args) == tags.Tags(allowed=(5, 7))
    assert branch_params([5, 7]).extra_args is None


def test_restricted_rows_follow_the_processor(monkeypatch):
    """Bias, soft cap and scale as the stock processor applies them; rows of different
    widths; an untied [vocab, hidden] head; untagged rows from the stock projection of the
    whole batch, bit for bit (a GEMM over a subset of rows may round differently)."""
    torch.manual_seed(0)
    vocab, hidden = 300, 16
    weight, bias, h = torch.randn(vocab, hidden), torch.randn(vocab), torch.randn(4, hidden)
    processor = SimpleNamespace(org_vocab_size=vocab, soft_cap=5.0, scale=0.5)
    stock_rows = []

    def stock(x):
        stock_rows.append(x.shape[0])
        return torch.tanh((x @ weight.T + bias) / 5.0) * 5.0 * 0.5

    rows, ids = [0, 2], [[7, 3, 299], [11]]
    out = lm_head.restricted_logits(processor, SimpleNamespace(weight=weight), h, bias, rows,
                                    ids, stock)
    assert stock_rows == [4]  # the whole batch, in one call, as the stock head runs it
    expected = stock(h)
    assert torch.equal(out[[1, 3]], expected[[1, 3]])
    for row, allowed in zip(rows, ids):
        assert torch.allclose(out[row, allowed], expected[row, allowed], atol=1e-5)
        assert torch.isinf(out[row]).sum() == vocab - len(allowed)


def test_codes_match_full_head_and_fp32_reference(fp32_llm, reference_model, monkeypatch):
    full, off_rows = run_pcd(fp32_llm, monkeypatch, SIX_FIELD_SCHEMA, False, "head-off",
                             formulation="codes")
    restricted, on_rows = run_pcd(fp32_llm, monkeypatch, SIX_FIELD_SCHEMA, True, "head-on",
                                  formulation="codes")
    assert off_rows == 0 and on_rows == len(SIX_FIELD_SCHEMA["properties"])
    assert lm_head.STATS.route == "torch"
    assert restricted.object == full.object
    plan = restricted.plan
    for i, (fp, a, b) in enumerate(zip(plan.fields, restricted.fields, full.fields)):
        assert worst(a.scores, b.scores) < SAME, fp.field.name
        expected = reference_scores(reference_model, plan.branch_ids(i), fp.code_ids)
        assert worst(a.scores, expected) < TOLERANCE, fp.field.name
        # The engine itself renormalised: its row held only the allowed ids.
        raw = restricted.execution.branches[i].logprobs
        assert math.isclose(sum(math.exp(v) for v in raw.values()), 1.0, rel_tol=1e-5)


def test_json_restricts_single_node_fields_only(fp32_llm, monkeypatch):
    full, _ = run_pcd(fp32_llm, monkeypatch, MIXED_SCHEMA, False, "json-off", formulation="json")
    restricted, rows = run_pcd(fp32_llm, monkeypatch, MIXED_SCHEMA, True, "json-on",
                               formulation="json")
    assert rows == sum([s.restricted for s in restricted.plan.scorings]) == 1
    assert restricted.diagnostics()["projection"] == {"route": "torch", "restricted_requests": 1,
                                                      "fallbacks": 0}
    assert full.diagnostics()["projection"] == {"route": None, "restricted_requests": 0,
                                                "fallbacks": 1}
    assert restricted.object == full.object
    for a, b in zip(restricted.fields, full.fields):
        assert worst(a.scores, b.scores) < SAME, a.field.name


def test_plain_request_in_a_restricted_batch_stays_stock(fp32_llm, tokenizer, monkeypatch):
    """One step runs a plain request, two tagged branches and a request with another
    plugin's extra_args; only the branches are restricted and the others get the stock
    log-probabilities."""
    plan = build_plan(tokenizer, parse_schema(SUPPORT_SCHEMA), as_messages(MESSAGE),
                      Options(formulation="codes"))
    plain = SamplingParams(max_tokens=1, temperature=0.0, logprobs=5, detokenize=False)
    foreign = SamplingParams(max_tokens=1, temperature=0.0, logprobs=5, detokenize=False,
                             extra_args={"allowed": ["not", "ids"], "other_plugin": 1})
    ids = [list(plan.shared_ids), *(plan.branch_ids(i) for i in range(2)), list(plan.shared_ids)]
    params = [plain, *(branch_params(fp.code_ids, restrict=True) for fp in plan.fields), foreign]

    def run(on):
        monkeypatch.setenv(lm_head.ENV, "1" if on else "0")
        salt = f"mixed-{on}"
        prompts = [TokensPrompt(prompt_token_ids=p, cache_salt=salt) for p in ids]
        return rows_restricted(lambda: fp32_llm.generate(prompts, params, use_tqdm=False))

    (full, off_rows), (restricted, on_rows) = run(False), run(True)
    assert (off_rows, on_rows) == (0, 2)
    for row in (0, 3):
        stock, got = full[row].outputs[0], restricted[row].outputs[0]
        assert got.token_ids == stock.token_ids
        assert {t: p.logprob for t, p in got.logprobs[0].items()} == \
               pytest.approx({t: p.logprob for t, p in stock.logprobs[0].items()}, abs=1e-6)
    for row, fp in zip((1, 2), plan.fields):
        stock = [full[row].outputs[0].logprobs[0][t].logprob for t in fp.code_ids]
        got = [restricted[row].outputs[0].logprobs[0][t].logprob for t in fp.code_ids]
        norm = math.log(sum(math.exp(v) for v in stock))
        assert worst(got, [v - norm for v in stock]) < SAME
        assert restricted[row].outputs[0].token_ids[0] in fp.code_ids


@pytest.mark.parametrize("forced", ["head", "runner"])
def test_a_forced_fallback_shows_in_the_measured_diagnostics(fp32_llm, monkeypatch, forced):
    """The worker falls back to the full head (a head it cannot read, a runner it cannot
    patch): the diagnostics, measured from the engine's outputs, say so, and the answer is
    the same."""
    restricted, _ = run_pcd(fp32_llm, monkeypatch, SIX_FIELD_SCHEMA, True, f"forced-{forced}",
                            formulation="codes")
    asked = sum([s.restricted for s in restricted.plan.scorings])
    assert restricted.diagnostics()["projection"] == {
        "route": "torch", "restricted_requests": asked, "fallbacks": 0}
    if forced == "head":
        monkeypatch.setattr(lm_head, "head_problem", lambda *a: "the head is quantized (test)")
    else:
        monkeypatch.setattr(lm_head, "runner_problem", lambda runner: "LoRA (test)")
    fallen, rows = run_pcd(fp32_llm, monkeypatch, SIX_FIELD_SCHEMA, True,
                           f"forced-{forced}-off", formulation="codes")
    assert rows == 0
    assert fallen.diagnostics()["projection"] == {
        "route": None, "restricted_requests": 0, "fallbacks": asked}
    assert fallen.object == restricted.object


def test_tensor_parallel_shards_sum_to_the_whole_head():
    """Two vocabulary shards, each projecting only the allowed ids it owns (0 elsewhere):
    their sum is the unsharded projection, including ids on either side of the boundary."""
    torch.manual_seed(1)
    vocab, hidden = 256, 32
    weight, bias, h = torch.randn(vocab, hidden), torch.randn(vocab), torch.randn(3, hidden)
    allowed = torch.tensor([[0, 127, 128, 255], [5, 5, 200, 131], [130, 129, 128, 64]])
    from vllm_pcd_kernels import project

    whole = project(h, weight, allowed, bias, "torch").logits
    shards = []
    for start, end in ((0, 128), (128, 256)):
        head = SimpleNamespace(weight=weight[start:end], shard_indices=SimpleNamespace(
            org_vocab_start_index=start, org_vocab_end_index=end))
        shards.append(lm_head.shard_values(head, h, allowed, bias[start:end], "torch")[0])
    owned_by_first = allowed < 128
    assert torch.all(shards[0][~owned_by_first] == 0) and torch.all(shards[1][owned_by_first] == 0)
    assert torch.allclose(shards[0] + shards[1], whole, atol=1e-6, rtol=0)


def test_restricted_rows_take_the_stock_heads_dtype():
    """A bf16 model's stock head returns bf16 logits; restricted rows are rounded the same
    way, so the restricted and full fields of a request share that arithmetic."""
    torch.manual_seed(2)
    vocab, hidden = 300, 64
    weight = (torch.randn(vocab, hidden) / 4).bfloat16()
    h = (torch.randn(2, hidden) * 4).bfloat16()
    processor = SimpleNamespace(org_vocab_size=vocab, soft_cap=None, scale=1.0, head_dtype=None)
    ids = [[3, 77, 299], [8, 9]]
    out = lm_head.restricted_logits(processor, SimpleNamespace(weight=weight), h, None, [0, 1],
                                    ids, lambda x: None)
    stock = (h @ weight.T).float()
    for row, allowed in enumerate(ids):
        got = out[row, allowed]
        assert torch.equal(got.bfloat16().float(), got)  # representable in bf16: rounded
        ulp = stock[row, allowed].abs() * 2 ** -7
        assert torch.all((got - stock[row, allowed]).abs() <= ulp), (got, stock[row, allowed])


def test_pcd_asks_for_the_v1_runner_unless_told_otherwise(monkeypatch):
    from vllm_pcd.internals import runner

    assert runner.choose_v1(True, None)
    assert not runner.choose_v1(True, "1") and not runner.choose_v1(True, "0")
    assert not runner.choose_v1(False, None)  # vLLM picked V1 itself (no GPU Triton, ...)

    logged = []

    class Config:
        picks_v2 = True

        @property
        def use_v2_model_runner(self):
            return self.picks_v2

    runner.patch_runner_choice(Config, logged.append)
    monkeypatch.delenv(runner.ENV, raising=False)
    assert Config().use_v2_model_runner is False and logged
    monkeypatch.setenv(runner.ENV, "1")
    assert Config().use_v2_model_runner is True
    Config.picks_v2 = False
    monkeypatch.delenv(runner.ENV)
    assert Config().use_v2_model_runner is False
