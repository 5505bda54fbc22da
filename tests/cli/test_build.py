"""cli/build: options that do not apply are refused before any work, in one line."""

import onnx

from trtattn.cli import main
from trtattn.testing.graphs import attention_model


def test_save_onnx_with_tp_is_refused_in_one_line_before_anything_is_written(tmp_path, capsys):
    model = tmp_path / "m.onnx"
    onnx.save(attention_model(), model)
    forms, engines = tmp_path / "forms", tmp_path / "engines"
    code = main(["build", str(model), "--tp", "2", "--save-onnx", str(forms), "--out-dir", str(engines)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert f"--save-onnx {forms} does not apply with --tp" in err and str(engines) in err
    assert not forms.exists() and not engines.exists()
