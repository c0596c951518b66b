"""Fitted calibration: the maps recover what was put into synthetic scores, profiles match only
their own schema and options, and the held-out half is never the fitted one."""

import json
import math
import os
import random
from dataclasses import replace
from types import SimpleNamespace

import pytest

from tests.conftest import (MESSAGE, PROFILE_TEMPERATURE, PROFILED_SCHEMA, SUPPORT_SCHEMA,
                            write_test_profile)
from vllm_pcd.core.scoring import (Identity, OptionBias, Row, Temperature, answer_points,
                                   balanced_accuracy, choose, expected_calibration_error,
                                   field_result, folds)
from vllm_pcd.core.plan import Options
from vllm_pcd.core.profiles import (MIN_CASES, Profile, ProfileBook, fit_profile, matches_model,
                                    read_profiles, write_profiles)
from vllm_pcd.core.schema import FieldSpec, parse_schema


def drawn(count, options, *, scale=1.0, shift=(), seed=0):
    """Rows whose gold is drawn from softmax(logits): the scores given are the logits times
    `scale` plus `shift`, the miscalibration a fitted map has to undo."""
    rng = random.Random(seed)
    shift = shift or [0.0] * options
    rows = []
    for _ in range(count):
        logits = [rng.gauss(0, 1.5) for _ in range(options)]
        top = max(logits)
        weights = [math.exp(v - top) for v in logits]
        gold = rng.choices(range(options), weights)[0]
        given = [v * scale + s for v, s in zip(logits, shift)]
        norm = max(given) + math.log(sum(math.exp(g - max(given)) for g in given))
        rows.append(Row([g - norm for g in given], gold))
    return rows


def test_a_temperature_undoes_overconfidence_and_keeps_every_answer():
    rows = drawn(600, 3, scale=3.0)
    fitted = Temperature.fit(rows)
    assert fitted.temperature == pytest.approx(3.0, rel=0.2)
    held_out = drawn(600, 3, scale=3.0, seed=1)
    before = answer_points(Identity(), held_out)
    after = answer_points(fitted, held_out)
    assert [ok for _, ok in after] == [ok for _, ok in before]
    assert expected_calibration_error(after) < expected_calibration_error(before) / 2


def test_option_biases_take_out_a_label_prior():
    rows = drawn(800, 2, shift=(2.0, 0.0))  # every answer tilted towards the first option
    fitted = OptionBias.fit(rows)
    assert fitted.bias[0] - fitted.bias[1] == pytest.approx(-2.0, abs=0.5)
    assert fitted.temperature == pytest.approx(1.0, rel=0.25)
    held_out = drawn(800, 2, shift=(2.0, 0.0), seed=1)
    hits = lambda c: sum(ok for _, ok in answer_points(c, held_out))  # noqa: E731
    assert hits(fitted) > hits(Identity()) + 40
    assert choose([rows], seed=0).method == "option_bias"


def test_balanced_accuracy_is_not_raised_by_always_answering_the_common_label():
    always_first = [Row([-0.1, -2.4], 0)] * 3 + [Row([-0.1, -2.4], 1)]
    assert balanced_accuracy(Identity(), always_first) == 0.5  # plain accuracy: 0.75
    assert balanced_accuracy(OptionBias(1.0, (0.0, 5.0)), always_first) == 0.5
    assert balanced_accuracy(Identity(), [Row([-0.1, -2.4], 0), Row([-2.4, -0.1], 1)]) == 1.0


def test_a_single_label_cannot_drive_a_bias_to_infinity():
    fitted = OptionBias.fit([Row([-0.1, -2.4], 0)] * 50)
    assert all(abs(b) < 100 for b in fitted.bias) and math.isfinite(fitted.temperature)


def profile(schema=SUPPORT_SCHEMA, **changes):
    base = Profile("SmolLM2-135M-Instruct", schema, {}, {"topic": Temperature(2.0),
                   "refund_requested": OptionBias(1.0, (-30.0, 30.0))},
                   {"refund_requested": 0.9}, {"ece": 0.02, "cases": 50})
    return Profile(**{**base.__dict__, **changes})


def test_a_profile_maps_each_field_and_marks_low_confidence():
    spec = parse_schema(SUPPORT_SCHEMA)
    topic, refund = spec.fields
    raw = [field_result(topic, [0.0, -2.0, -4.0, -4.0]), field_result(refund, [-0.1, -2.4])]
    mapped_topic, mapped_refund = profile().apply(raw)
    expected = [math.exp(s / 2) for s in raw[0].scores]
    assert [math.exp(s) for s in mapped_topic.scores] == pytest.approx(
        [e / sum(expected) for e in expected])
    assert "low_confidence" not in mapped_topic.extra  # no threshold for it
    assert mapped_refund.value is False and mapped_refund.extra["low_confidence"] is False
    candidates = mapped_refund.diagnostics()["candidates"]
    assert [c["uncalibrated_score"] for c in candidates] == list(raw[1].scores)
    unsure = profile(thresholds={"topic": 0.99}).apply(raw)[0]
    assert unsure.extra["low_confidence"] is True


# A date field whose values share leading tokens: full-vocabulary scores favour 12/05 and so
# does their mass per first token (0.25 for `0`, 0.45 for `1`), while the constrained
# decoder's stepwise scores hold 0.75 for `0` and go on to 01/07.
DATE = FieldSpec("date", "enum", ("01/06", "01/07", "12/05"))
DATE_PATHS = ((0, 1, 6), (0, 1, 7), (1, 2, 5))
DATE_FULL = tuple(math.log(p) for p in (0.10, 0.15, 0.45))
DATE_STEPWISE = tuple(math.log(p) for p in (0.35, 0.40, 0.25))


def test_held_out_figures_measure_the_answer_the_server_gives():
    """A greedy row is answered as served: uncalibrated along the stepwise path, through a
    map by the mapped scores grouped by shared tokens; a most-probable row by its best score."""
    greedy_row = Row(DATE_FULL, 1, "greedy", DATE_PATHS, DATE_STEPWISE)
    [(p, ok)] = answer_points(Identity(), [greedy_row])
    assert ok and p == pytest.approx(0.15)  # 01/07, at the probability the response gives it
    assert answer_points(Identity(), [greedy_row._replace(decision="most_probable")]) == [
        (pytest.approx(0.45), False)]
    [(p, ok)] = answer_points(Temperature(1.0), [greedy_row._replace(gold=2)])
    assert ok and p == pytest.approx(0.45 / 0.70)


def test_a_profile_that_keeps_the_scores_keeps_the_greedy_path():
    """A profile whose map for a field is `none` answers that field as an uncalibrated call
    does; a real map chooses from its own scores."""
    spec = parse_schema({"type": "object", "properties": {"date": {"enum": list(DATE.options)}},
                         "required": ["date"], "additionalProperties": False})
    raw = replace(field_result(spec.fields[0], DATE_FULL, paths=DATE_PATHS,
                               stepwise=DATE_STEPWISE), decision="greedy")
    assert raw.value == "01/07"
    keep = Profile("m", {}, {}, {"date": Identity()}, {}, {})
    assert keep.apply([raw])[0].value == "01/07"
    assert Profile("m", {}, {}, {"date": Temperature(1.0)}, {}, {}).apply([raw])[0].value == "12/05"


def test_a_profile_matches_only_its_schema_its_options_and_no_calibration_asked():
    book = ProfileBook([profile()])
    spec = parse_schema(SUPPORT_SCHEMA)
    assert book.find(spec, Options()) is not None
    reworded = json.loads(json.dumps(SUPPORT_SCHEMA))
    reworded["properties"]["topic"]["description"] = "What the message is about"
    assert book.find(parse_schema(reworded), Options()) is None
    assert book.find(spec, Options(layout="document_first")) is None
    assert book.find(spec, Options(mode="sequence")) is None
    assert book.find(spec, Options(calibration="content_free")) is None
    assert ProfileBook().find(spec, Options()) is None


def test_profiles_round_trip_and_bad_files_are_refused(tmp_path):
    path = tmp_path / "profile.json"
    write_profiles(path, [profile()])
    [back] = read_profiles(path)
    assert back == profile()
    (tmp_path / "other.json").write_text(json.dumps({"profiles": []}))
    with pytest.raises(ValueError, match="not a vllm-pcd calibration profile"):
        read_profiles(tmp_path / "other.json")
    data = json.loads(path.read_text())
    data["profiles"][0]["fields"].pop("topic")
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="schema's fields"):
        read_profiles(path)
    data["profiles"][0]["options"] = {"calibration": "content_free"}
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="cannot set calibration"):
        read_profiles(path)


def test_a_profile_serves_only_its_model():
    assert matches_model(profile(), ["/root/models/SmolLM2-135M-Instruct/"])
    assert not matches_model(profile(), ["/root/models/Qwen2.5-1.5B", "qwen"])


def test_the_engine_config_names_the_profiles_and_drops_other_models(tmp_path):
    from vllm_pcd.pipeline import profiles_of

    write_profiles(tmp_path / "p.json", [profile(), profile(model="another-model")])
    config = lambda extra: SimpleNamespace(  # noqa: E731
        additional_config=extra, model_config=SimpleNamespace(
            model="/models/SmolLM2-135M-Instruct", served_model_name=None))
    assert len(profiles_of(config({"pcd": {"calibration_profiles": [str(tmp_path / "p.json")]}
                                   }))) == 1
    assert len(profiles_of(config({}))) == 0
    with pytest.raises(ValueError, match="calibration_profiles: .*missing.json"):
        profiles_of(config({"pcd": {"calibration_profiles": str(tmp_path / "missing.json")}}))


def test_fit_profile_holds_out_half_and_reports_both_sides():
    spec = parse_schema(SUPPORT_SCHEMA)
    rows = {"topic": drawn(120, 4, scale=3.0, seed=2),
            "refund_requested": drawn(120, 2, shift=(2.5, 0.0), seed=3)}
    fitted, points = fit_profile("m", SUPPORT_SCHEMA, Options(), rows, seed=0, threshold=0.8)
    held = fitted.held_out
    assert held["cases"] == held["fitted_cases"] == 60
    assert len(points["none"]) == len(points["profile"]) == 2 * 60
    assert fitted.method == "option_bias"  # the tilted boolean needs its biases
    assert held["ece"] < held["uncalibrated"]["ece"]
    assert 0 <= held["uncalibrated"]["balanced_accuracy"] <= 1
    assert held["balanced_accuracy"] > held["uncalibrated"]["balanced_accuracy"]
    assert 0 <= held["low_confidence"]["share"] <= 1
    assert ProfileBook([fitted]).find(spec, Options()) is fitted
    few = {name: r[:MIN_CASES - 1] for name, r in rows.items()}
    with pytest.raises(ValueError, match="at least"):
        fit_profile("m", SUPPORT_SCHEMA, Options(), few)
    small, _ = fit_profile("m", SUPPORT_SCHEMA, Options(),
                           {name: r[:40] for name, r in rows.items()})
    assert small.method in ("none", "temperature")  # too few cases for per-option biases
    assert len({id(c) for c in small.fields.values()}) == 1  # one map over every field


def test_the_offline_api_applies_the_engine_s_profiles(fp32_llm, model_path, tmp_path,
                                                       monkeypatch):
    """An `LLM` built with `additional_config={"pcd": {"calibration_profiles": …}}` answers as
    the server does: its schema calibrated, every other one untouched."""
    from vllm_pcd import constrained

    config = fp32_llm.llm_engine.vllm_config
    plain = constrained(fp32_llm, MESSAGE, PROFILED_SCHEMA)
    monkeypatch.setattr(config, "additional_config", {"pcd": {"calibration_profiles": [
        str(write_test_profile(tmp_path, model_path))]}})
    result = constrained(fp32_llm, MESSAGE, PROFILED_SCHEMA)
    diag = result.diagnostics()
    assert diag["calibrated"] is True and result.object["urgent"] is False
    assert diag["fields"]["channel"]["low_confidence"] is True
    raw = plain.diagnostics()["fields"]["channel"]["candidates"]
    expected = [math.exp(c["score"] / PROFILE_TEMPERATURE) for c in raw]
    assert [c["probability"] for c in diag["fields"]["channel"]["candidates"]] == pytest.approx(
        [e / sum(expected) for e in expected], abs=1e-6)
    assert constrained(fp32_llm, MESSAGE, SUPPORT_SCHEMA).diagnostics()["calibrated"] is False


def test_cross_validation_folds_cover_every_case_once():
    parts = folds(23, 5, seed=3)
    assert sorted(i for part in parts for i in part) == list(range(23))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    assert folds(23, 5, seed=3) == parts != folds(23, 5, seed=4)


def test_the_command_scores_labelled_cases_and_writes_a_profile_that_loads(fp32_llm, model_path,
                                                                          tmp_path):
    """`vllm_pcd.calibrate`'s two steps on the engine: PCD scores every labelled case, a
    schema with too few cases is left out, and the profile written is one a server loads."""
    from vllm_pcd.calibrate import calibrate, labelled_groups, read_cases

    channels = ["email", "phone", "chat"]
    lines = [{"message": f"Ticket {k}: please {channels[k % 3]} me, it is "
                         f"{'urgent' if k % 2 else 'not urgent'}.",
              "schema": PROFILED_SCHEMA,
              "expected": {"urgent": bool(k % 2), "channel": channels[k % 3]}} for k in range(24)]
    lines += [{"message": "Hi", "schema": SUPPORT_SCHEMA, "expected": {}}]  # one case: skipped
    data = tmp_path / "labelled.jsonl"
    data.write_text("\n".join(json.dumps(line) for line in lines))
    groups = labelled_groups(fp32_llm, read_cases(data), Options())
    assert [schema for schema, _ in groups] == [PROFILED_SCHEMA]
    rows = groups[0][1]
    assert {name: len(r) for name, r in rows.items()} == {"urgent": 24, "channel": 24}
    assert all(len(row.scores) == 3 and row.gold == k % 3 and row.decision == "greedy"
               for k, row in enumerate(rows["channel"]))  # token mode's default decision
    profiles, points = calibrate(str(model_path), groups, Options(), out=open(os.devnull, "w"))
    assert len(points["profile"]) == 2 * 12  # two fields of the 12 held-out cases
    write_profiles(tmp_path / "p.json", profiles)
    [loaded] = read_profiles(tmp_path / "p.json")
    assert loaded.key() == profiles[0].key() and loaded.held_out["cases"] == 12


def test_the_accuracy_objective_takes_the_most_right_answers():
    """A tilt towards the first option that per-option biases undo, where a temperature
    calibrates best: chosen for probabilities, the temperature; for answers, the biases."""
    rows = drawn(200, 2, shift=(0.8, 0.0), seed=2)
    for_ece, for_answers = choose([rows], seed=0), choose([rows], seed=0, objective="accuracy")
    scores = for_answers.cross_validated
    assert for_ece.method == "temperature" and for_answers.method == "option_bias"
    assert scores["option_bias"]["accuracy"] == max(s["accuracy"] for s in scores.values())
    with pytest.raises(ValueError, match="objective"):
        choose([rows], seed=0, objective="loss")


def test_saved_rows_keep_their_decision_and_old_saves_read_as_most_probable(tmp_path):
    """`benchmarks.calibration --rows` fits saved rows again: a row saved with its decision
    is answered as before; a row saved before rows kept one is what it measured then."""
    from benchmarks.calibration import saved_groups

    greedy_row = Row(DATE_FULL, 1, "greedy", DATE_PATHS, DATE_STEPWISE)
    saved = {"rows": {"tuned": [[{"schema": 1}, {"date": [greedy_row, [list(DATE_FULL), 1]]}]]}}
    (tmp_path / "run.json").write_text(json.dumps(saved))
    [(schema, fields)] = saved_groups(tmp_path / "run.json")["tuned"]
    again, old = fields["date"]
    assert schema == {"schema": 1} and again == greedy_row and old == Row(DATE_FULL, 1)
    assert [ok for _, ok in answer_points(Identity(), [again, old])] == [True, False]


def test_a_low_confidence_threshold_is_chosen_on_the_fitting_half_for_an_accuracy():
    from vllm_pcd.core.profiles import threshold_for

    points = [(0.95, True), (0.9, True), (0.8, False), (0.7, True), (0.6, False), (0.5, False)]
    assert threshold_for(points, 0.75) == 0.7   # 3 of the 4 at or above 0.7 are right
    assert threshold_for(points, 1.0) == 0.9
    assert threshold_for(points, 0.5) == 0.5    # all kept: half of them right
    assert threshold_for([(0.9, False)], 0.9) > 1  # nothing reaches it: every answer flagged
    assert threshold_for([(0.9, True), (0.9, False)], 1.0) > 1  # ties stay together
