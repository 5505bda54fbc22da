"""Issue 34: a Conformer-style attention (ONNX Runtime's optimizer generators) and a tf2onnx Einsum attention,
built by hand; ONNX Runtime runs each, and fuse fuses its one attention, verified."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import trtattn
from trtattn.testing.converted_graphs import conformer_attention, einsum_attention

MODELS = {"conformer": lambda: conformer_attention(),
          "conformer_shared_qk": lambda: conformer_attention(shared_qk=True, past=3),
          "einsum_10000": lambda: einsum_attention(),
          "einsum_1e9": lambda: einsum_attention(fill=-1e9),
          "einsum_float_min": lambda: einsum_attention(fill=float(np.finfo(np.float32).min))}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_converted_attention_is_fused_and_verified(name):
    model = MODELS[name]()
    ort.InferenceSession(model.SerializeToString())  # the reference runs it as written
    result = trtattn.fuse(model)
    assert result.ok, [r.reason for r in result.reports]
    assert [r.status.value for r in result.reports] == ["fused"]
