"""pytest fixtures for trtsim. tests/conftest.py can make them global with

    from trtsim.fixtures import real_trt, checked_trt  # noqa: F401

Tests using them carry the `conformance` marker (checked API) or `reference` (executor); both markers
are registered in pyproject.toml.
"""

from __future__ import annotations

import pytest

from . import bindings
from .checked import checked


@pytest.fixture(scope="session")
def real_trt(tmp_path_factory):
    """The real TensorRT Python bindings (tensorrt_bindings), importable without TensorRT's libraries.
    Only for introspection: nothing in it may be called. Skips with the reason when unavailable."""
    module = bindings.load_bindings(tmp_path_factory.mktemp("trtsim"))
    if module is None:
        pytest.skip(f"real TensorRT bindings unavailable: {bindings.unavailable_reason}")
    return module


@pytest.fixture
def checked_trt(real_trt):
    """A fresh checked, recording `tensorrt` stand-in (its own call log) for one test."""
    return checked(real_trt)
