"""trtattn/timings.py: phases recorded only inside a recording, nested by name, sessions counted where they are
opened; `--timings` on the command line prints the table on stderr and adds it to the report."""

import json

import onnx

from trtattn import timings
from trtattn.cli import main
from trtattn.graph.evaluate import ort_session
from trtattn.testing.graphs import attention_model


def test_a_phase_outside_a_recording_measures_nothing():
    with timings.phase("verify") as row:
        assert row is None
    timings.session_made()  # counted nowhere, and no error


def test_phases_nest_by_name_and_add_up_their_calls():
    with timings.recording() as recorder:
        for _ in range(2):
            with timings.phase("verify"):
                with timings.phase("fit dims"):
                    pass
                timings.session_made()
        with timings.phase("write"):
            timings.session_made()
            timings.session_made()
    t = recorder.timings
    assert [p.name for p in t.phases] == ["verify", "verify/fit dims", "write"]
    assert t.row("verify").calls == 2 and t.row("verify/fit dims").calls == 2 and t.row("write").calls == 1
    assert t.row("verify").sessions == 2 and t.row("write").sessions == 2 and t.row("verify/fit dims").sessions == 0
    assert t.sessions == 4
    assert t.row("verify").seconds >= t.row("verify/fit dims").seconds
    assert t.row("verify").seconds + t.row("write").seconds <= t.total_seconds


def test_an_open_phase_keeps_the_peak_of_the_phases_inside_it():
    with timings.recording() as recorder:
        with timings.phase("outer"):
            with timings.phase("inner"):
                block = bytearray(64 << 20)  # touched: 64 MB resident
                block[::4096] = b"x" * len(block[::4096])
            del block
    t = recorder.timings
    assert t.row("outer/inner").peak_bytes > 0
    assert t.row("outer").peak_bytes >= t.row("outer/inner").peak_bytes


def test_the_table_accounts_for_time_outside_every_phase():
    t = timings.Timings(phases=[timings.Phase("read", 1.0, 1), timings.Phase("read/x", 0.5, 1)], total_seconds=4.0)
    lines = t.table().splitlines()
    assert lines[0].split()[:2] == ["phase", "seconds"]
    other = next(line for line in lines if line.startswith("(other)"))
    assert other.split()[1] == "3.000"  # 4 - 1: the nested phase is inside read, not beside it


def test_ort_sessions_are_counted_where_they_are_opened():
    with timings.recording() as recorder, timings.phase("run"):
        ort_session(attention_model())
    assert recorder.timings.row("run").sessions == 1


def test_fuse_with_timings_prints_the_phases_and_writes_them_into_the_report(tmp_path, capsys):
    model = tmp_path / "m.onnx"
    onnx.save(attention_model(), str(model))
    report = tmp_path / "r.json"
    assert main(["-q", "fuse", str(model), "-o", str(tmp_path / "f.onnx"), "--report", str(report), "--timings"]) == 0
    err = capsys.readouterr().err
    table = err[err.index("timings:"):]
    for name in ("read", "match and probe", "rewrite", "verify", "reload", "write", "total"):
        assert f"\n{name} " in table
    written = json.loads(report.read_text())
    phases = {p["name"]: p for p in written["timings"]["phases"]}
    assert {"read", "match and probe", "rewrite", "verify", "write"} <= set(phases)
    assert phases["verify"]["sessions"] >= 2  # the original and the rewrite, each run once at least
    assert written["timings"]["sessions"] >= sum(p["sessions"] for p in phases.values() if "/" not in p["name"])
    assert written["sites"]  # the report is the command's, with the timings added


def test_without_timings_the_report_has_none(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(attention_model(), str(model))
    report = tmp_path / "r.json"
    assert main(["-q", "fuse", str(model), "-o", str(tmp_path / "f.onnx"), "--report", str(report)]) == 0
    assert "timings" not in json.loads(report.read_text())


def test_fuse_opens_one_session_per_graph_it_runs(tmp_path, zoo_export):
    """Verification runs the original and the rewrite once each and the reload opens the written file once:
    no phase opens a second session on a graph it already has one for."""
    report = tmp_path / "r.json"
    args = ["-q", "fuse", str(zoo_export("bart-sdpa", "dynamo")), "-o", str(tmp_path / "f.onnx"), "--report", str(report)]
    assert main([*args, "--timings"]) == 0
    phases = {p["name"]: p for p in json.loads(report.read_text())["timings"]["phases"]}
    assert phases["verify"]["sessions"] == 2 and phases["reload"]["sessions"] == 1
    assert phases["rewrite"]["sessions"] == 0 and phases["verify/fit dims"]["sessions"] == 0


def test_the_analysis_measures_a_torchscript_export_in_one_session(tmp_path, zoo_export):
    """TorchScript BART: the dims ONNX's inference cannot name and the shapes the matcher asks for are measured in
    one session (graph/measure.inferred_shapes), the masks probed in another: two, not one more for each."""
    report = tmp_path / "r.json"
    args = ["-q", "fuse", str(zoo_export("bart", "torchscript")), "-o", str(tmp_path / "f.onnx"), "--report", str(report)]
    assert main([*args, "--timings"]) == 0
    phases = {p["name"]: p for p in json.loads(report.read_text())["timings"]["phases"]}
    assert phases["match and probe"]["sessions"] == 2
