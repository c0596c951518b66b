"""Evaluation cases built from public data, on synthetic task files: no test may depend on the
downloaded data."""

import json

import pytest

from benchmarks import public_data
from vllm_pcd.core.schema import parse_schema

YES_NO = {"description": "d", "examples": [
    {"input": "Is water wet?", "target_scores": {"Yes": 1, "No": 0}},
    {"input": "Is fire cold?", "target_scores": {"Yes": 0, "No": 1}},
    {"input": "Two answers?", "target_scores": {"Yes": 1, "No": 1}},  # not single-answer
]}
BBQ = {"examples": [
    {"input": "Ann and Bob met. Ann was late. Who was late?",
     "target_scores": {"Ann": 1, "Bob": 0, "Unknown": 0}},
    {"input": "Ann and Bob met. Ann was late. Who was on time?",
     "target_scores": {"Ann": 0, "Bob": 1, "Unknown": 0}},
    {"input": "Cy and Di met. Who left?", "target_scores": {"Cy": 0, "Di": 0, "Unknown": 1}},
]}


INTENTS = {"examples": [
    {"input": f"Utterance: request {i}", "target_scores": {"play_music": int(i % 2 == 0),
                                                         "get_weather": int(i % 2 == 1)}}
    for i in range(7)]}


# Nearly every example lists its gold first, as BIG-bench's date_understanding does.
GOLD_FIRST = {"examples": [
    {"input": f"Which is day {i}?", "target_scores": {f"day {i}": int(i != 7), f"day {i + 1}": 0,
                                                     f"day {i + 2}": 0, f"day {i + 3}": 0,
                                                     f"day {i + 4}": int(i == 7)}}
    for i in range(40)]}


@pytest.fixture
def tasks(monkeypatch):
    files = {"strategyqa": YES_NO, "other/sub": BBQ, "intent_recognition": INTENTS,
             "gold_first": GOLD_FIRST}
    files.update({f"bbq_lite_json/{c}_{k}": BBQ if (c, k) == ("age", "ambig") else {"examples": []}
                  for c in public_data.BBQ_CATEGORIES for k in ("ambig", "disambig")})
    monkeypatch.setattr(public_data, "bigbench_tasks", lambda names: [files[n] for n in names])


def test_yes_no_tasks_become_booleans(tasks):
    cases = list(public_data.bigbench("strategyqa"))
    assert [c["expected"] for c in cases] == [{"answer_is_yes": True}, {"answer_is_yes": False}]
    assert cases[0]["schema"]["properties"]["answer_is_yes"]["type"] == "boolean"
    for case in cases:
        parse_schema(case["schema"])


def test_other_tasks_keep_each_examples_options(tasks):
    cases = list(public_data.bigbench("other/sub"))
    assert cases[2]["schema"]["properties"]["answer"]["enum"] == ["Cy", "Di", "Unknown"]
    assert cases[2]["expected"] == {"answer": "Unknown"}


def test_a_task_that_always_lists_its_gold_first_has_its_options_shuffled(tasks):
    cases = list(public_data.bigbench("gold_first"))
    firsts = [c["schema"]["properties"]["answer"]["enum"][0] == c["expected"]["answer"]
              for c in cases]
    assert 2 <= sum(firsts) <= 20  # about 1 in 5 by chance, not 39 of 40
    for case, example in zip(cases, GOLD_FIRST["examples"]):
        assert sorted(case["schema"]["properties"]["answer"]["enum"]) == sorted(
            example["target_scores"])
    assert cases == list(public_data.bigbench("gold_first"))  # the same shuffle every time
    assert [c["schema"]["properties"]["answer"]["enum"][0] for c in public_data.bigbench(
        "other/sub")] == ["Ann", "Ann", "Cy"]  # a task whose gold moves keeps its order


def test_bbq_pairs_ask_both_questions_of_one_context(tasks):
    [case] = public_data.bbq_pairs()  # the lone question of the second context is left out
    assert case["message"] == "Ann and Bob met. Ann was late."
    props = case["schema"]["properties"]
    assert props["answer_2"]["description"] == "The answer to: Who was on time?"
    assert case["expected"] == {"answer_1": "Ann", "answer_2": "Bob"}


def test_sampling_is_fixed_by_the_seed(tasks):
    first = public_data.load("bigbench:strategyqa", 1)
    assert first == public_data.load("bigbench:strategyqa", 1)


def test_multi_field_sets_give_each_text_its_own_field_and_gold(tasks):
    cases = list(public_data.intent_multi())
    assert len(cases) == 2  # seven utterances make two whole cases of three
    seen = []
    for case in cases:
        parse_schema(case["schema"])
        lines = case["message"].splitlines()
        assert [line.split(":")[0] for line in lines] == ["Utterance 1", "Utterance 2",
                                                          "Utterance 3"]
        for k, line in enumerate(lines, start=1):
            number = int(line.rsplit(" ", 1)[1])
            gold = "play_music" if number % 2 == 0 else "get_weather"
            assert case["expected"][f"utterance_{k}_intent"] == gold
            seen.append(number)
    assert len(set(seen)) == 6
    assert cases == list(public_data.intent_multi())


def test_excluded_draws_leave_only_fresh_cases(tasks):
    first = public_data.load("intent_multi", 1)
    fresh = public_data.load("intent_multi", 5, exclude=[1])
    assert len(fresh) == 1 and fresh[0]["id"] != first[0]["id"]
    assert fresh == public_data.load("intent_multi", 5, exclude=[1])
    assert public_data.load("intent_multi", 5, exclude=[2]) == []


def test_a_package_the_registry_no_longer_has_is_named_in_a_clear_error(monkeypatch, tmp_path):
    """BIG-bench 1.0.0 left the registry: the harness says which package and where
    a copy would go, not pip's exit status."""
    import subprocess

    def no_such_version(*_args, **_kwargs):
        raise subprocess.CalledProcessError(1, "pip")

    monkeypatch.setattr(public_data, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(public_data.subprocess, "check_call", no_such_version)
    with pytest.raises(RuntimeError, match=r"bigbench==1\.0\.0 could not be downloaded.*"
                                           r"bigbench-1\.0\.0\.tar\.gz"):
        public_data.archive("bigbench")


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
