"""trtattn/verification.py: the Verification record as reports write it (only the fields a check set, `passed`
always) and the typed record the commands read."""

from __future__ import annotations

import json

from trtattn.verification import Verification


def test_nothing_verified_writes_an_empty_record_and_not_verified_writes_passed_null():
    assert Verification.nothing().to_json() == {}
    assert Verification().to_json() == {"passed": None}
    assert Verification(passed=True, note="no attention found").to_json() == {"passed": True,
                                                                              "note": "no attention found"}


def test_only_the_fields_a_check_set_are_written_in_the_report_order():
    v = Verification(passed=False, iterations=2, atol=1e-4, rtol=1e-4, max_abs_err=0.5, outputs={"y": 0.5},
                     nan_mismatch=[], bounds={"y": 1e-4}, one_key=["attn"])
    data = v.to_json()
    assert list(data) == ["passed", "iterations", "atol", "rtol", "max_abs_err", "outputs", "nan_mismatch", "bounds",
                          "one_key"]
    assert data["nan_mismatch"] == [] and v.failed and json.loads(json.dumps(data)) == data


def test_branches_and_the_widened_check_are_written_as_records_of_their_own():
    part = Verification(passed=True, max_abs_err=1e-6, atol=1e-4, rtol=1e-4, iterations=2, outputs={"y": 1e-6})
    merged = Verification(passed=True, branches={"c=True": part, "c=False": Verification(passed=None)},
                          widened_fp32=part.headline())
    data = merged.to_json()
    assert data["branches"] == {"c=True": part.to_json(), "c=False": {"passed": None}}
    assert data["widened_fp32"] == {"passed": True, "atol": 1e-4, "rtol": 1e-4, "max_abs_err": 1e-6}
    assert not Verification(passed=None).failed
