"""The MiniCPM5-2B stand-in (`vllm_pcd.standin`): its derived shape gives the release's
parameter counts, and PCD renders its MiniCPM-style chat template with thinking off although
the template thinks by default. The last test serves a 2-layer stand-in: slower (about 1.2 GB
of bf16, most of it the 130,560-row embedding and head)."""

import json

import httpx
import pytest

from tests.conftest import API_KEY, MESSAGE, SUPPORT_SCHEMA, computed_tokens, server_args
from vllm_pcd import standin
from vllm_pcd.core.plan import build_plan, render_text
from vllm_pcd.core.schema import SchemaError, parse_schema
from vllm_pcd.models import minicpm5_shape
from vllm_pcd.pipeline import as_messages

REPLY_START = "<|im_start|>assistant\n"
THINKING_OFF = "<think>\n\n</think>\n\n"


@pytest.mark.vllm024
def test_the_derived_shape_gives_the_release_counts():
    layer = standin.parameters(1)[1] - standin.HIDDEN  # one layer, without the final norm
    assert layer == 47_190_016
    assert standin.parameters(standin.RELEASE_LAYERS) == (
        standin.RELEASE_PARAMETERS, standin.RELEASE_NON_EMBEDDING_PARAMETERS)


@pytest.mark.vllm024
def test_transformers_builds_the_same_model_from_the_config():
    """An independent count: transformers' Llama of the stand-in's config, on the meta device,
    has exactly the checkpoint's tensors and the release's parameters."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**standin.config(standin.RELEASE_LAYERS, {})))
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert shapes == standin.tensor_shapes(standin.RELEASE_LAYERS)
    total = sum(p.numel() for p in model.parameters())
    head = model.model.embed_tokens.weight.numel() + model.lm_head.weight.numel()
    assert model.lm_head.weight is not model.model.embed_tokens.weight  # untied
    assert total == standin.RELEASE_PARAMETERS
    assert total - head == standin.RELEASE_NON_EMBEDDING_PARAMETERS
    assert model.config.max_position_embeddings == 131_072


@pytest.fixture(scope="module")
def minicpm_tokenizer(model_path):
    """The stand-in's tokenizer: the default model's with the MiniCPM-style template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.chat_template = standin.CHAT_TEMPLATE
    return tokenizer


@pytest.mark.vllm024
def test_the_template_thinks_by_default_and_pcd_renders_thinking_off(minicpm_tokenizer):
    messages = as_messages(MESSAGE)
    default = minicpm_tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                    tokenize=False)
    assert default.endswith(REPLY_START + "<think>\n")
    assert render_text(minicpm_tokenizer, messages).endswith(REPLY_START + THINKING_OFF)
    plan = build_plan(minicpm_tokenizer, parse_schema(SUPPORT_SCHEMA), messages)
    # the shared context may end inside the block's last newlines, which merge with the
    # answer's first token; a scoring request's whole prompt holds the block as rendered
    reply = minicpm_tokenizer.decode(plan.shared_ids).rsplit(REPLY_START, 1)[1]
    assert reply.startswith("<think>\n\n</think>") and reply.count("<think>") == 1
    branch = minicpm_tokenizer.decode(plan.prompts()[1]).rsplit(REPLY_START, 1)[1]
    assert branch.startswith(THINKING_OFF)
    with pytest.raises(SchemaError, match="thinking"):
        build_plan(minicpm_tokenizer, parse_schema(SUPPORT_SCHEMA), messages,
                   template_kwargs={"enable_thinking": True})


@pytest.fixture(scope="module")
def standin_server(tmp_path_factory):
    """`VLLM_PLUGINS=pcd vllm serve` on a 2-layer stand-in (written once into the cache)."""
    from vllm_pcd.launch import serve

    path = minicpm5_shape(layers=2)
    log = tmp_path_factory.mktemp("minicpm5") / "vllm.log"
    with serve(path, args=server_args(), log_path=log) as url:
        with httpx.Client(base_url=url, timeout=300,
                          headers={"Authorization": f"Bearer {API_KEY}"}) as client:
            yield path, client


def test_a_served_stand_in_answers_with_thinking_off(standin_server):
    """vLLM serves a head of 130,560 rows over a 49,152-token tokenizer, and PCD answers.
    PCD's context is the thinking-off prompt planned here, token for token in length, while
    the server's own rendering of the template (`/tokenize`) opens a think block."""
    from transformers import AutoTokenizer

    path, client = standin_server
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = client.get("/v1/models").json()["data"][0]["id"]
    messages = as_messages(MESSAGE)
    response = client.post("/v1/chat/completions", json={
        "model": model, "messages": messages,
        "chat_template_kwargs": {"pcd_schema": SUPPORT_SCHEMA}})
    assert response.status_code == 200, response.text
    body = response.json()
    answer = json.loads(body["choices"][0]["message"]["content"])
    assert answer["topic"] in SUPPORT_SCHEMA["properties"]["topic"]["enum"]
    assert isinstance(answer["refund_requested"], bool)
    plan = build_plan(tokenizer, parse_schema(SUPPORT_SCHEMA), messages)
    tokens = body["pcd"]["tokens"]
    assert tokens["shared"] == len(plan.shared_ids)
    assert tokens["computed"] == computed_tokens(plan)
    rendered = client.post("/tokenize", json={"model": model, "messages": messages,
                                              "add_generation_prompt": True}).json()["tokens"]
    assert tokenizer.decode(rendered).endswith(REPLY_START + "<think>\n")
