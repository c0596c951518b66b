import json
import math
from dataclasses import replace

import pytest

from vllm_pcd.core.schema import FieldSpec, SchemaSpec, to_json
from vllm_pcd.core.scoring import assemble, field_result, log_softmax


def test_log_softmax_renormalises():
    out = log_softmax([math.log(0.2), math.log(0.6)])
    assert out == pytest.approx([math.log(0.25), math.log(0.75)])
    assert log_softmax([-1000.0, -1001.0])[0] == pytest.approx(-math.log1p(math.exp(-1)))
    with pytest.raises(ValueError):
        log_softmax([-math.inf, -math.inf])


def test_field_result_picks_best_and_reports_margin():
    field = FieldSpec("t", "enum", ("a", "b", "c"))
    r = field_result(field, [-3.0, -1.0, -2.0])
    assert r.value == "b" and r.margin == pytest.approx(1.0)
    d = r.diagnostics()
    assert [c["value"] for c in d["candidates"]] == ["a", "b", "c"]
    assert sum(c["probability"] for c in d["candidates"]) == pytest.approx(1.0)


def test_ties_go_to_schema_order():
    assert field_result(FieldSpec("t", "enum", ("a", "b")), [-1.0, -1.0]).value == "a"


def test_assemble_types_and_order():
    spec = SchemaSpec((FieldSpec("ok", "boolean", (True, False)),
                       FieldSpec("lang", "enum", ("English", "Español"))))
    obj = assemble(spec, [field_result(spec.fields[0], [-2.0, -0.1]),
                          field_result(spec.fields[1], [-2.0, -0.1])])
    assert obj == {"ok": False, "lang": "Español"}
    assert to_json(obj) == '{"ok":false,"lang":"Español"}'
    assert json.loads(to_json(obj)) == obj


def test_score_count_must_match_options():
    with pytest.raises(ValueError):
        field_result(FieldSpec("t", "enum", ("a", "b")), [-1.0])


# Three options: two share their first token (7) and split its 0.6; the third holds 0.4.
SPLIT = dict(raw=[math.log(0.3), math.log(0.3), math.log(0.4)],
             paths=[(1, 7, 8), (1, 7, 9), (1, 5)])


def test_greedy_takes_the_heaviest_shared_token_where_most_probable_takes_the_heaviest_value():
    field = FieldSpec("intent", "enum", ("search_event", "search_work", "get_weather"))
    r = field_result(field, SPLIT["raw"], paths=SPLIT["paths"])
    assert r.value == "get_weather" and r.margin == pytest.approx(math.log(0.4 / 0.3))
    greedy = replace(r, decision="greedy")
    assert greedy.value == "search_event"  # 0.6 behind token 7; then the tie to schema order
    assert greedy.margin == pytest.approx(math.log(0.3 / 0.4))  # below the best other option
    assert greedy.diagnostics()["decision"] == "greedy"
    assert "decision" not in r.diagnostics()
    assert [c["probability"] for c in greedy.diagnostics()["candidates"]] == pytest.approx(
        [0.3, 0.3, 0.4])  # the decision changes the value, never the scores


@pytest.mark.parametrize("raw", [[-0.2, -3.0, -1.5], [-3.0, -0.2, -1.5], [-2.0, -2.5, -0.3]])
def test_greedy_and_most_probable_agree_where_no_token_is_shared(raw):
    field = FieldSpec("t", "enum", ("a", "b", "c"))
    r = field_result(field, raw, paths=[(1, 4), (1, 5), (1, 6)])
    assert replace(r, decision="greedy").value == r.value
    assert replace(field_result(field, raw), decision="greedy").value == r.value  # no paths


def test_a_greedy_group_decides_at_every_shared_token():
    # 0.45 behind token 2 and 0.55 behind token 4, split 0.3 / 0.25.
    field = FieldSpec("t", "enum", ("a", "b", "c", "d"))
    r = field_result(field, [math.log(p) for p in (0.25, 0.2, 0.3, 0.25)],
                     paths=[(2, 3), (2, 6), (4, 3), (4, 6)])
    assert r.value == "c" and replace(r, decision="greedy").value == "c"
    r = field_result(field, [math.log(p) for p in (0.35, 0.05, 0.3, 0.3)],
                     paths=[(2, 3), (2, 6), (4, 3), (4, 6)])
    assert r.value == "a" and replace(r, decision="greedy").value == "c"  # 0.6 behind 4


def test_greedy_reads_the_stepwise_scores_where_a_trie_gives_them():
    """Full-vocabulary scores lose the mass the model puts on text that is no value; greedy
    reads each token renormalised among the values' tokens, as a constrained decoder does."""
    field = FieldSpec("date", "enum", ("01/06", "01/07", "12/05"))
    paths = [(0, 1, 6), (0, 1, 7), (1, 2, 5)]
    full = [math.log(p) for p in (0.10, 0.15, 0.45)]        # '0' → '1' → ... loses mass
    stepwise = [math.log(p) for p in (0.35, 0.40, 0.25)]    # '0' holds 0.75 among the values
    r = field_result(field, full, paths=paths, stepwise=stepwise)
    assert r.value == "12/05" and replace(r, decision="greedy").value == "01/07"
