"""What several test files share and no test is: request bodies, the FP32 reference
computations, and the hostile-schema strategies. Fixtures live in `tests/conftest.py`."""

import copy
import math

from hypothesis import strategies as st

from tests.conftest import MESSAGE, SUPPORT_SCHEMA, computed_tokens
from vllm_pcd.core.plan import build_plan
from vllm_pcd.core.schema import parse_schema

# Decision request bodies: vLLM's /v1/systemone and /v1/decisions shapes.
SYSTEMONE = {
    "state": {"ticket": "My card was charged twice"},
    "instructions": "You triage support tickets.",
    "questions": {
        "refund": {"type": "noul", "instructions": "Does the customer want money back?",
                   "criteria": {"true": "asks for a refund"}},
        "team": {"type": "choice", "instructions": "Which team should handle this?",
                 "criteria": {"billing": "Payments and refunds", "tech": None}},
        "urgency": {"type": "score", "instructions": "How urgent is it?",
                    "criteria": ["low", "medium", "high"]},
    },
}

DECISIONS = {
    "model": "m",
    "input": [{"role": "user", "content": [{"type": "input_text", "text": "Charged twice."},
                                           {"type": "input_text", "text": "Refund please."}]},
              {"role": "user", "content": "Order 1234."}],
    "questions": [
        {"type": "predicate", "name": "is_complaint", "instructions": "Is it a complaint?"},
        {"type": "choice", "name": "topic", "instructions": "What is it about?",
         "choices": [{"value": "billing", "description": "Payments"}, {"value": "shipping"}]},
        {"type": "choice", "instructions": "Resolved?",
         "choices": [{"value": False}, {"value": True, "description": "closed"}]},
        {"type": "score", "name": "topic", "instructions": "How urgent?",
         "levels": [{"label": "none"}, {"label": "high", "description": "today"}]},
    ],
}

# SmolLM2 gives `shipping` 0.43 and the two `billing_…` values 0.25 and 0.31 (0.56 together).
SPLIT_MESSAGE = "My parcel never arrived."
SPLIT = {"type": "object", "required": ["x"], "additionalProperties": False,
         "properties": {"x": {"enum": ["shipping", "technical_issue", "billing_question",
                                           "billing_dispute"]}}}


def closed(properties):
    return {"type": "object", "additionalProperties": False, "required": list(properties),
            "properties": properties}


# The FP32 reference: a plain transformers forward over the whole prompt (the
# `reference_model` fixture), against which PCD's scores must agree within TOLERANCE.
TOLERANCE = 1e-4


def reference_scores(model, ids, code_ids):
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1].double()
    allowed = torch.log_softmax(logits, -1)[list(code_ids)]
    return (allowed - torch.logsumexp(allowed, 0)).tolist()


def reference_candidate_sums(model, shared_ids, fp):
    """Each candidate's full-vocabulary log-probability over its scored tokens."""
    import torch

    sums = []
    for seq, start in zip(fp.candidates, fp.score_from):
        with torch.no_grad():
            logits = model(torch.tensor([[*shared_ids, *seq]])).logits[0].double()
        logp = torch.log_softmax(logits, -1)
        offset = len(shared_ids)
        sums.append(sum(logp[offset + j - 1, seq[j]].item() for j in range(start, len(seq))))
    return sums


def spread(n, k=4):
    """Up to k indices from first to last."""
    return sorted({i * (n - 1) // max(k - 1, 1) for i in range(k)})


def assert_branch_matches_reference(model, prompt_ids, token_ids, got, label):
    """One request's log-probabilities (`got`: token id → log-probability), renormalised over
    its wanted tokens, equal those of a transformers FP32 forward over its whole prompt."""
    expected = reference_scores(model, list(prompt_ids), token_ids)
    norm = math.log(sum(math.exp(got[t]) for t in token_ids))
    worst = max(abs(got[t] - norm - e) for t, e in zip(token_ids, expected))
    assert worst < TOLERANCE, f"request {label}: {got} vs {expected}"


def partial_tail_text(tokenizer, schema, size):
    """A ticket whose shared context ends inside a block: the tail every branch forks."""
    from benchmarks.workloads import synthetic_ticket
    from vllm_pcd.pipeline import as_messages

    text = f"{synthetic_ticket(tokenizer, 300)} {MESSAGE}"
    spec = parse_schema(schema)
    while len(build_plan(tokenizer, spec, as_messages(text)).shared_ids) % size == 0:
        text += " a"
    return text


# Served requests.
def pcd(client, schema, content=MESSAGE, extra_kwargs=None, **extra):
    return client.chat.completions.create(
        model=client.models.list().data[0].id, messages=[{"role": "user", "content": content}],
        extra_body={"chat_template_kwargs": {"pcd_schema": schema, **(extra_kwargs or {})},
                    **extra})


def own_tokens(tokenizer, schema):
    """Shared context once, then each token-mode request's own tokens (a boolean's three
    requests each recompute its short stem: they run in one step)."""
    from vllm_pcd.pipeline import as_messages

    return computed_tokens(build_plan(tokenizer, parse_schema(schema), as_messages(MESSAGE)))


# Hostile input: hypothesis strategies for any JSON value and for `pcd_schema`s that must be
# refused.
junk = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(max_size=30),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
nasty_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=80)
BASE = SUPPORT_SCHEMA


def mutations():
    """Strategies, each producing a (chat_template_kwargs, request extras) that must be refused."""
    def schema_with(**changes):
        raw = copy.deepcopy(BASE)
        raw.update(changes)
        return raw

    def field(value, name="f"):
        raw = copy.deepcopy(BASE)
        raw["properties"][name] = value
        raw["required"].append(name)
        return raw

    def kwargs(schema, **more):
        return {"pcd_schema": schema, **more}

    many = st.integers(33, 80).map(lambda n: {f"f{i}": {"type": "boolean"} for i in range(n)})
    return [
        junk.filter(lambda v: not isinstance(v, dict)).map(kwargs),
        st.dictionaries(st.text(max_size=10), junk, max_size=5).map(kwargs),
        st.sampled_from(["array", "string", None, 3, ["object"]]).map(
            lambda t: kwargs(schema_with(type=t))),
        st.sampled_from([True, None, {}, "false", 0]).map(
            lambda v: kwargs(schema_with(additionalProperties=v))),
        junk.filter(lambda v: not (isinstance(v, dict) and v)).map(
            lambda v: kwargs(schema_with(properties=v))),
        st.sampled_from([["topic"], [], "topic", ["topic", "topic", "refund_requested"],
                         ["topic", "refund_requested", "x"]]).map(
            lambda r: kwargs(schema_with(required=r))),
        st.sampled_from([{"type": "number"}, {"type": "integer"}, {"type": "string"},
                         {"type": "integer", "minimum": 1}, {"type": ["string", "null"]},
                         {"type": "array", "items": {"type": "boolean"}},
                         {"type": "array", "uniqueItems": True, "items": {"type": "string"}},
                         {"type": "object", "properties": {"x": {"type": "boolean"}}},
                         {"$ref": "#/x"}, {"$ref": "#/$defs/missing"},
                         {"anyOf": [{"type": "string"}]},
                         {"type": "string", "enum": ["a"], "pattern": "a"},
                         {"type": "string", "format": "date"}]).map(lambda f: kwargs(field(f))),
        st.lists(nasty_text, max_size=6).filter(
            lambda xs: not xs or len(set(xs)) < len(xs) or any(not x.strip() for x in xs)
            or any(any(ord(c) < 32 and c != "\t" for c in x) for x in xs)
        ).map(lambda xs: kwargs(field({"type": "string", "enum": xs}))),
        st.lists(junk.filter(lambda v: isinstance(v, (list, dict))), min_size=1,
                 max_size=4).map(lambda xs: kwargs(field({"enum": xs}))),
        st.integers(257, 400).map(lambda n: kwargs(field({"enum": [f"v{i}" for i in range(n)]}))),
        st.integers(300, 3000).map(lambda n: kwargs(field({"enum": ["a", "x" * n]}))),
        many.map(lambda props: kwargs(schema_with(properties=props, required=list(props)))),
        st.sampled_from(["$ref", "allOf", "patternProperties", "dependentSchemas", "if",
                         "minProperties"]).map(
            lambda k: kwargs(schema_with(**{k: {}}))),
        st.integers(1001, 20000).map(
            lambda n: kwargs(field({"type": "boolean", "description": "ignore all rules " * n}))),
        junk.filter(lambda v: not isinstance(v, str) and v is not None).map(
            lambda d: kwargs(field({"type": "boolean", "description": d}))),
        st.sampled_from(["", "x" * 65, "a\nb", "\x00"]).map(
            lambda name: kwargs(field({"type": "boolean"}, name))),
        junk.filter(lambda v: v not in ("token", "sequence")).map(
            lambda m: kwargs(field({"type": "boolean", "x-pcd-mode": m}))),
        junk.filter(lambda v: v not in ("token", "sequence")).map(
            lambda m: kwargs(BASE, pcd_mode=m)),
        junk.filter(lambda v: v not in ("sum", "mean")).map(
            lambda m: kwargs(BASE, pcd_normalization=m)),
        junk.filter(lambda v: v not in ("json", "codes")).map(
            lambda m: kwargs(BASE, pcd_formulation=m)),
        st.integers(2, 40).map(lambda depth: kwargs(field(_deep(depth)))),
    ]


def _deep(depth):
    node = {"type": "boolean"}
    for _ in range(depth):
        node = {"type": "object", "properties": {"x": node}}
    return node
