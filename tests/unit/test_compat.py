import pytest

from vllm_pcd import compat


def test_patch_targets_must_exist():
    class Target:
        def present(self):
            pass

    compat.require_methods(Target, "present", patch="demo")
    with pytest.raises(compat.UnsupportedVLLMVersion, match="demo: .*Target lacks \\['absent'\\]"):
        compat.require_methods(Target, "present", "absent", patch="demo")


def test_unknown_vllm_version_is_refused(monkeypatch):
    monkeypatch.setattr(compat, "vllm_version", lambda: "0.99.0")
    with pytest.raises(compat.UnsupportedVLLMVersion, match="0.99.0"):
        compat.check_vllm_version()
