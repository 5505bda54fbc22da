"""The foreign-export corpus: small attention models written by exporters and tools other than torch's
(tf2onnx, paddle2onnx, jax2onnx, onnxconverter-common, onnxsim, onnxslim, ONNX Runtime's optimizer and
dynamic quantization, onnx.inliner, low opsets), committed under tests/data/foreign/ with a manifest,
so CI tests them without installing tensorflow, paddle or jax. make.py regenerates them.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3] / "tests" / "data" / "foreign"
MANIFEST = ROOT / "manifest.json"
FIELDS = ("file", "exporter", "exporter_version", "framework", "source", "expected_sites", "exercises")


def load_manifest(path: Path = MANIFEST) -> list[dict]:
    """The manifest rows: file, exporter, exporter_version, framework, source, expected_sites, exercises."""
    rows = json.loads(Path(path).read_text())
    for row in rows:
        missing = [f for f in FIELDS if f not in row]
        if missing:
            raise ValueError(f"{path}: row {row.get('file')} lacks {', '.join(missing)}")
    return rows
