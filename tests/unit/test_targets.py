"""The wheel check (`vllm_pcd.targets`): PCD's patch targets, found by parsing a wheel's
sources. Checked against a wheel made of the installed vLLM's own files (every target the
same), and against copies with one target's parameters changed and one target removed."""

import inspect
import zipfile
from pathlib import Path

import pytest

from vllm_pcd import targets

pytestmark = pytest.mark.vllm024  # runs on vLLM 0.24 (FlagOS hosts) too


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


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory):
    """Every Python source of the installed vLLM, laid out as a wheel."""
    import vllm

    root = Path(vllm.__file__).parent
    path = tmp_path_factory.mktemp("wheel") / "installed.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for source in root.rglob("*.py"):
            archive.writestr(str(source.relative_to(root.parent)), source.read_text())
    return path


def test_every_vllm_name_pcd_imports_is_in_the_installed_sources(installed_wheel):
    from vllm_pcd.compat import adapter_name

    rows = targets.compare_imports(installed_wheel, targets.imported(adapter_name()))
    assert len(rows) > 30
    assert [r for r in rows if r[2] != "same"] == []
    # through a star import (vllm.distributed re-exports parallel_state's names)
    assert ("import", "vllm.distributed.tensor_model_parallel_all_reduce", "same",
            "vllm_pcd/internals/lm_head.py") in rows


def test_a_missing_module_or_name_is_reported(installed_wheel):
    rows = targets.compare_imports(installed_wheel, {
        ("vllm.v1.core.kv_cache_utils", "hash_block_tokens_renamed"): "a.py",
        ("vllm.no_such_module", "x"): "b.py", ("vllm.v1.core", "kv_cache_utils"): "c.py"})
    assert [r[2] for r in rows] == ["missing", "same", "missing"]


def test_each_adapter_brings_its_own_imports_and_those_it_builds_on():
    on_033 = {m for m, _ in targets.imported("v0_33")}
    on_024 = {m for m, _ in targets.imported("v0_24")}
    assert "vllm.exceptions" in on_033  # the 0.32 adapter's, which 0.33's re-exports
    assert "vllm.entrypoints.serve.utils.error_response" in on_024 - on_033


def test_the_wheels_adapter_states_where_its_targets_differ(recorded, tmp_path):
    key = ("vllm.v1.core.kv_cache_manager", "KVCacheManager.get_computed_blocks")
    for version, names in (("0.32.0", ("self", "request")),
                           ("0.33.0", ("self", "request", "max_cache_hit_length"))):
        got = targets.expected(tmp_path / f"vllm-{version}-cp38-abi3-any.whl", recorded)
        assert tuple(n for n, _ in got[key][1]) == names
        assert {k: v for k, v in got.items() if k != key} == \
            {k: v for k, v in recorded.items() if k != key}


def test_the_033_lookup_passes_the_schedulers_limit_to_the_extended_hit():
    from types import SimpleNamespace

    from vllm_pcd.internals import v0_33

    seen = []

    def stock(manager, request, max_cache_hit_length=None):
        seen.append(max_cache_hit_length)
        return "blocks", 128, 7

    def extend(manager, request, blocks, hit, limit):
        seen.append(limit)
        return blocks + "+tail", hit + 5

    lookup = v0_33.lookup_with(stock, extend)
    request = SimpleNamespace(num_tokens=300)
    assert lookup(None, request) == ("blocks+tail", 133, 7)
    assert lookup(None, request, 200) == ("blocks+tail", 133, 7)
    assert seen == [None, 299, 200, 200]
