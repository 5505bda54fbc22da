import hashlib
import os
from pathlib import Path

import numpy as np
import onnx
import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

# the modules in helpers/ (trtsim/, trtsim_cases.py, ...) are importable through pytest's `pythonpath` option
# (pyproject.toml)
from trtsim.fixtures import checked_trt, real_trt  # noqa: E402,F401  (the real TensorRT bindings, checked)

# the test files sit at different depths under tests/ (tests/<package>/test_<module>.py): paths start here
ROOT = Path(__file__).resolve().parent.parent  # the project's checkout
DATA = Path(__file__).resolve().parent / "data"  # committed models and files the tests read


def _export_key() -> str:
    """What a zoo export depends on: the zoo's own code and the exporting packages' versions."""
    from importlib.metadata import PackageNotFoundError, version

    import trtattn.zoo

    digest = hashlib.sha256()
    for source in sorted(Path(trtattn.zoo.__file__).parent.rglob("*.py")):
        digest.update(source.read_bytes())
    for package in ("torch", "transformers", "onnx", "onnxscript"):
        try:
            digest.update(f"{package} {version(package)}".encode())
        except PackageNotFoundError:  # (a venv without it exports nothing that needs it)
            digest.update(f"{package} -".encode())
    return digest.hexdigest()[:12]


@pytest.fixture(scope="session")
def zoo_dir(tmp_path_factory):
    """Exports are shared by every test of a session, and by its pytest-xdist workers (one folder beside theirs);
    TRTATTN_ZOO_CACHE keeps them across sessions. Whoever asks first exports, the others wait (zoo.exported)."""
    cached = os.environ.get("TRTATTN_ZOO_CACHE")
    if cached:  # a folder per exporting code and exporter versions, so no stale export is ever reused
        path = Path(cached) / _export_key()
    else:
        base = tmp_path_factory.getbasetemp()
        path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "zoo"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def zoo_export(zoo_dir):
    from trtattn import zoo

    def get(name: str, exporter: str) -> Path:
        return zoo.exported(zoo_dir / f"{name}.{exporter}.onnx", lambda path: zoo.export(name, exporter, path))

    return get


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def ort_run(model: onnx.ModelProto | str | Path, feeds: dict) -> list[np.ndarray]:
    """The outputs of `model` (in memory, or its file) on ONNX Runtime's CPU provider with default session
    options: the reference every model trtattn writes is held to."""
    import onnxruntime as ort

    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feeds)


def ort_outputs(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    """ort_run's outputs by the model's output names."""
    return dict(zip([o.name for o in model.graph.output], ort_run(model, feeds)))


def graph_model(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    """A model of one graph "g" at `opset` of the default domain."""
    graph = onnx.helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])


def one_node_model(op: str, inputs: list, outputs: list, opset: int = 17, inits=(), **attrs) -> onnx.ModelProto:
    """A model of one `op` node from the value infos `inputs` to `outputs`."""
    node = onnx.helper.make_node(op, [i.name for i in inputs], [o.name for o in outputs], **attrs)
    return graph_model([node], inputs, outputs, inits, opset)


def scaled_initializer(model: onnx.ModelProto, name: str, factor: float) -> onnx.ModelProto:
    """A copy of `model` with initializer `name` multiplied by `factor` (in its own dtype)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    init = next(i for i in out.graph.initializer if i.name == name)
    value = onnx.numpy_helper.to_array(init)
    init.CopyFrom(onnx.numpy_helper.from_array((value.astype(np.float64) * factor).astype(value.dtype), name))
    return out


def largest_matrix(model: onnx.ModelProto) -> str:
    """The name of the model's largest 2-D initializer (a projection's weight)."""
    return max(model.graph.initializer, key=lambda i: int(np.prod(i.dims)) if len(i.dims) == 2 else 0).name


def tampering(real):
    """forms.verify_form that checks a copy of the derived model with its largest weight scaled by 1.5: a form
    whose rewrite went wrong (monkeypatched over the real one)."""
    def verify_form(form, original, derived, sites, **kwargs):
        return real(form, original, scaled_initializer(derived, largest_matrix(derived), 1.5), sites, **kwargs)
    return verify_form


def site_statuses(result) -> list:
    """(status, reason) of each site a fuse result reports."""
    return [(r.status, r.reason) for r in result.reports]


def mask_step_ops(result) -> list[list[str]]:
    """The mask steps' ops of each site a match result finds."""
    return [[s.op for s in site.mask_steps] for site in result.sites]


# zoo-wide parametrizations run these in the fast lane (-m "not slow"); every other zoo model is marked slow
FAST_ZOO = {("llama", "torchscript"), ("bert", "dynamo")}


def zoo_cases():
    from trtattn import zoo

    return [(e.name, x) if (e.name, x) in FAST_ZOO else pytest.param(e.name, x, marks=pytest.mark.slow)
            for e in zoo.ZOO.values() for x in e.exporters]


def exporter_cases(fast: str = "torchscript"):
    """A family test's `exporter` values: `fast` in the fast lane, the other in the slow one. For tests whose
    point is the family, not the exporter: each export of a model costs seconds (a dynamo one 10-20 s), and the
    slow lane's zoo-wide sweep exports every model with both anyway."""
    from trtattn.zoo import EXPORTERS

    return [x if x == fast else pytest.param(x, marks=pytest.mark.slow) for x in EXPORTERS]


def class_cases():
    """(name, exporter) of every zoo entry that exercises a class of attention (zoo.CLASSES): each entry once in
    the fast lane, with its first exporter (TorchScript where it has it), and with another exporter only where that
    export shows a class the first does not; the other exports in the slow lane."""
    from trtattn import zoo

    cases = []
    for e in zoo.ZOO.values():
        for x in e.exporters if e.classes else ():
            first = e.exporters[0]
            fast = x == first or set(e.classes_for(x)) - set(e.classes_for(first))
            cases.append((e.name, x) if fast else pytest.param(e.name, x, marks=pytest.mark.slow))
    return cases


@pytest.fixture(scope="session")
def autocast():
    """ModelOpt's AutoCast, imported once (it imports torch: seconds), or the test skips saying why."""
    from trtattn.errors import MissingDependencyError
    from trtattn.rewrite import precision

    try:
        return precision.load_autocast()
    except MissingDependencyError as e:
        pytest.skip(str(e))
