"""The intra-op threads of trtattn's own ONNX Runtime sessions: one for a small model, ONNX Runtime's default
pool above graph/ort_threads.SINGLE_THREAD_BYTES of weights."""

from __future__ import annotations

import onnxruntime as ort

from trtattn.graph.evaluate import ort_session, session_options
from trtattn.graph.ort_threads import SINGLE_THREAD_BYTES, set_threads
from trtattn.testing.graphs import attention_model


def test_a_small_models_session_runs_on_one_thread():
    session = ort_session(attention_model())
    assert session.get_session_options().intra_op_num_threads == 1


def test_a_model_over_the_bound_keeps_the_default_pool():
    assert session_options(weights=SINGLE_THREAD_BYTES + 1).intra_op_num_threads == 0  # 0: one per core
    assert session_options(weights=SINGLE_THREAD_BYTES).intra_op_num_threads == 1


def test_set_threads_leaves_a_large_models_options_as_given():
    options = ort.SessionOptions()
    options.intra_op_num_threads = 3
    set_threads(options, SINGLE_THREAD_BYTES + 1)
    assert options.intra_op_num_threads == 3
