"""Branch tokens equal the tokenization of the whole text, with a real SentencePiece tokenizer.

A SentencePiece model with a dummy prefix writes `▁{` at the start of a text, but `{` after a
newline inside one: a branch tokenized on its own is a sequence the model never reads. The
tokenizer here is trained in a second on a few lines, then every planned branch is compared
with `tokenizer.encode(context + branch)`.
"""

import io
import json

import pytest

from tests.conftest import MESSAGE, SIX_FIELD_SCHEMA
from vllm_pcd.core.plan import (DEFAULT_LAYOUT, FieldPlan, Formulation, Layout, Options,
                                build_plan, instruction_text, render_text, serialize)
from vllm_pcd.core.schema import parse_schema

spm = pytest.importorskip("sentencepiece")
transformers = pytest.importorskip("transformers")

TEMPLATE = ("{% for m in messages %}[{{ m.role }}]\n{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant]\n{% endif %}")


@pytest.fixture(scope="module")
def sp_tokenizer(tmp_path_factory):
    spec = parse_schema(SIX_FIELD_SCHEMA)
    layout, as_json = Layout.named(DEFAULT_LAYOUT), Formulation.named("json")
    listed = [(f, None) for f in spec.fields]
    corpus = [MESSAGE, instruction_text(listed, as_json, layout),
              instruction_text(listed, Formulation.named("codes"), layout),
              *(as_json.stem(f) + serialize(o) for f in spec.fields for o in f.options),
              *(f"{f.name}: {code}" for f in spec.fields for code in "ABCDEF"),
              "true false yes no , } { : \" [user] [assistant]"] * 20
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_writer=model, vocab_size=600, model_type="bpe",
        byte_fallback=True, add_dummy_prefix=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, character_coverage=1.0, minloglevel=2)
    folder = tmp_path_factory.mktemp("sp")
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "LlamaTokenizer", "add_bos_token": False, "legacy": False,
         "chat_template": TEMPLATE}))
    return transformers.AutoTokenizer.from_pretrained(str(folder))


def _rendered(tokenizer, spec, plan, formulation):
    codes = [fp.codes if isinstance(fp, FieldPlan) else None for fp in plan.fields]
    layout = Layout.named(DEFAULT_LAYOUT)
    instruction = instruction_text(list(zip(spec.fields, codes)), Formulation.named(formulation),
                                   layout)
    return render_text(tokenizer, layout.with_instruction([{"role": "user", "content": MESSAGE}],
                                                          instruction,
                                                          [f.name for f in spec.fields]))


def _value_texts(fp, formulation):
    """Each option's whole continuation, with the terminator its plan scores."""
    stem = Formulation.named(formulation).stem(fp.field)
    if isinstance(fp, FieldPlan):
        return [stem + code for code in fp.codes]
    return [stem + serialize(option, fp.terminator or "", fp.space) for option in fp.field.options]


@pytest.mark.parametrize("formulation,mode", [("json", "token"), ("json", "sequence"),
                                              ("codes", "token"), ("json_next", "token"),
                                              ("json_tight", "token")])
def test_branch_ids_are_the_tokenization_of_the_whole_text(sp_tokenizer, formulation, mode):
    spec = parse_schema(SIX_FIELD_SCHEMA)
    plan = build_plan(sp_tokenizer, spec, [{"role": "user", "content": MESSAGE}],
                      Options(mode=mode, formulation=formulation))
    text = _rendered(sp_tokenizer, spec, plan, formulation)
    for fp in plan.fields:
        for k, whole_text in enumerate(_value_texts(fp, formulation)):
            whole = sp_tokenizer.encode(text + whole_text, add_special_tokens=False)
            if isinstance(fp, FieldPlan):
                got = [*plan.branch_ids(plan.fields.index(fp)), fp.code_ids[k]]
                assert got == whole
            else:
                got = [*plan.shared_ids, *fp.candidates[k]]
                assert got == (whole if fp.terminated else whole[:len(got)])


def test_the_tokenizer_writes_a_dummy_prefix_at_a_texts_start(sp_tokenizer):
    """What makes the test above able to fail: the stem alone does not tokenize as it does in
    context, so planning from the stem's own tokens would score other tokens. (This model
    also merges the newline before `{`: the shared context then ends one token earlier.)"""
    stem = Formulation.named("json").stem(parse_schema(SIX_FIELD_SCHEMA).fields[0])
    alone = sp_tokenizer.encode(stem, add_special_tokens=False)
    context = sp_tokenizer.encode("[assistant]\n", add_special_tokens=False)
    in_context = sp_tokenizer.encode("[assistant]\n" + stem, add_special_tokens=False)
    assert in_context[:len(context) - 1] == context[:-1]
    assert in_context[len(context) - 1:] != alone
    assert sp_tokenizer.convert_ids_to_tokens(alone)[0].startswith("▁")
