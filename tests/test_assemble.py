import json
import math

import pytest

from vllm_pcd.core.assemble import assemble, to_json
from vllm_pcd.core.scoring import field_result, log_softmax
from vllm_pcd.core.schema import FieldSpec, SchemaSpec


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
