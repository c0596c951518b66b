"""The wheel check (`vllm_pcd.targets`): PCD's patch targets, found by parsing a wheel's
sources. Checked against a wheel made of the installed vLLM's own files (every target the
same), and against copies with one target's parameters changed and one target removed."""

import inspect
import zipfile
from pathlib import Path

import pytest

from vllm_pcd import targets


@pytest.fixture(scope="module")
def recorded():
    return targets.recorded()


def _wheel(path: Path, edit=lambda module, text: text) -> Path:
    """A zip holding the installed vLLM's source of every module PCD patches, as a wheel
    lays them out, each passed through `edit`."""
    import importlib

    import vllm

    root = Path(vllm.__file__).parent.parent
    with zipfile.ZipFile(path, "w") as archive:
        for module in {m for m, _ in targets.recorded()}:
            source = Path(inspect.getsourcefile(importlib.import_module(module)))
            archive.writestr(str(source.relative_to(root)), edit(module, source.read_text()))
    return path


def test_the_patches_record_every_target_they_check(recorded):
    names = {qualname for _, qualname in recorded}
    assert {"Scheduler.schedule", "KVCacheManager.get_computed_blocks", "LogitsProcessor.forward",
            "Sampler.gather_specific_token_logprobs", "OpenAIServingChat.create_chat_completion",
            "OpenAIServingResponses.create_responses", "LLM.chat", "ChatParams.__init__",
            "EngineCore.preprocess_add_request"} <= names
    patches = {patch for patch, _ in recorded.values()}
    assert {"fork", "admission", "lm_head", "sampler", "intake", "validation", "handler"} <= patches


def test_the_installed_vllms_own_sources_match_every_target(recorded, tmp_path):
    rows = targets.compare(_wheel(tmp_path / "same.whl"), recorded)
    assert len(rows) == len(recorded)
    assert [r for r in rows if r[2] != "same"] == []


def test_a_changed_and_a_removed_target_are_reported(recorded, tmp_path):
    def edit(module, text):
        if module == "vllm.v1.sample.sampler":
            return text.replace("def gather_specific_token_logprobs(",
                                "def gather_specific_token_logprobs(extra, ", 1)
        if module == "vllm.v1.engine.core":
            return text.replace("def preprocess_add_request(", "def preprocess_renamed(", 1)
        return text

    rows = {r[1].rsplit(".", 2)[-2] + "." + r[1].rsplit(".", 1)[-1]: r
            for r in targets.compare(_wheel(tmp_path / "edited.whl", edit), recorded)}
    assert rows["Sampler.gather_specific_token_logprobs"][2] == "changed"
    assert "(extra, self" in rows["Sampler.gather_specific_token_logprobs"][3].split("→")[1]
    assert rows["EngineCore.preprocess_add_request"][2] == "missing"
    assert sum(r[2] != "same" for r in rows.values()) == 2


def test_a_dataclass_init_is_read_from_its_fields():
    source = ("from dataclasses import dataclass\n@dataclass(frozen=True, kw_only=True)\n"
              "class P:\n    a: int = 1\n    b: 'ClassVar[int]' = 2\n    c: str = ''\n")
    assert targets.find(source, "P.__init__") == (
        ("self", "POSITIONAL_OR_KEYWORD"), ("a", "KEYWORD_ONLY"), ("c", "KEYWORD_ONLY"))
    assert targets.find(source, "P.other") is None
