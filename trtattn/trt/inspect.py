"""`trtattn inspect`: prove from an engine's layer info that every attention runs as a fused kernel.

    trtattn inspect ENGINE | LAYERINFO.json | LAYERINFO.log [--sites SIDECAR.json] [--require-fused] [--json]

Three inputs, one model of the layer info (a list of engine layers, each with a name, a type, a
tactic, ONNX node names and tensor names):

- a serialized engine, read through TensorRT's IEngineInspector (JSON format); needs TensorRT;
- a trtexec ``--exportLayerInfo=f.json`` file: ``{"Layers": [...], "Bindings": [...]}``, each layer
  a dict (``--profilingVerbosity=detailed``) or only a name (layer-names-only verbosity);
- a trtexec ``--dumpLayerInfo`` log: the ``Layers:`` section of one ``Name: ..., LayerType: ...``
  line per layer (kONELINE format), or the builder's verbose ``Layer(TYPE): NAME, Tactic: ...``
  lines ("Engine Layer Information").

An attention is *fused* when a layer of it carries a fused attention kernel: a Myelin ``kgen`` layer
(or a ForeignNode) whose name or tactic names an ``mha`` / ``fmha`` / ``_gemm_mha_v2`` / flash
kernel, or a layer whose type is an attention. It is *not fused* when it runs as separate gemm +
softmax + gemm layers. Attentions are found from the ONNX node names the parser records (Metadata
``[ONNX Layer: /model/layers.0/self_attn/Softmax]``, or the layer names themselves): a Softmax
between two MatMuls of the same module (or, for exports without module scopes, fed by a MatMul
and feeding one) is an attention; any other Softmax (a classifier head) is reported apart and
never counted. Sites swapped for IAttention by ``trtattn build`` are found by their names (layer
name or metadata ``trtattn/attn/<site>``) and through the sidecar JSON the builder writes.

Only kernel names prove fusion: module names such as ``.../mha/...`` inside ONNX paths are never
taken as evidence.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import MissingDependencyError, TrtattnError

__all__ = [
    "Layer", "LayerInfo", "load_layer_info", "parse_layer_info_json", "parse_layer_info_log", "read_engine",
    "load_sites", "classify", "render_table", "add_inspect_parser", "run_inspect", "main",
]

ENGINE_SUFFIXES = (".engine", ".plan", ".trt")

# --- what a fused attention kernel is called --------------------------------------------------------------
# `_gemm_mha_v2_myl0_17`, TacticName `_gemm_mha_v2_0x957a...`, `fmha_v2_flash_attention_fp16_...`,
# `sm80_fmha_...`: the token mha/fmha (or flash attention) standing on its own between separators.
_KERNEL_RE = re.compile(r"(?i)(?:^|[^a-z0-9])(f?mha|flash_?att(?:ention|n)?)(?=$|[^a-z])")
_ATTENTION_TYPE_RE = re.compile(r"(?i)^(?!.*(?:input|output|boundary)).*attention|^f?mha$")  # not IAttention's I/O markers
_MATMUL_TYPE_RE = re.compile(r"(?i)gemm|matrixmultiply|matmul")
_SOFTMAX_TYPE_RE = re.compile(r"(?i)^soft_?max$")
_SOFTMAX_OP_RE = re.compile(r"(?i)softmax")
_MATMUL_OP_RE = re.compile(r"(?i)matmul|einsum|bmm|gemm")
_OPAQUE_TYPE_RE = re.compile(r"(?i)^myelin$")

_ONNX_RE = re.compile(r"\[ONNX Layer: ([^\]\x1e\x1f]*)\]")
_SEPARATORS = re.compile(r"[\x1e\x1f]")
_MYELIN_SUFFIX = re.compile(r"_myl\d+_\d+$")
_PROFILE_RE = re.compile(r"\s*\[profile (\d+)\]")
_FOREIGN_RE = re.compile(r"\{ForeignNode\[(.*)\]\}")
_TRTATTN_RE = re.compile(r"trtattn/attn/([^\s\[\]{}()+,;|\x1e\x1f]+)")  # IAttention + its support layers
_SITE_META_RE = re.compile(r"trtattn site=([^\s\[\]\x1e\x1f]+)")  # the IAttention's metadata (plan.metadata())
_LOG_PREFIX = re.compile(r"^\[\d{2}/\d{2}/\d{4}-\d{2}:\d{2}:\d{2}\] \[[A-Z]\] (?:\[TRT\] )?")
_BUILDER_LINE = re.compile(r"^Layer\((?P<type>[^)]*)\): (?P<rest>.*)$")
_FIELD_START = re.compile(r"[A-Za-z][\w/]*: ")
_PLUS = re.compile(r"\s+\+\s+|\+(?=/)")  # `A + B`; Myelin names join ONNX paths with a bare `+`

WINDOW = 4  # layers searched on each side of a softmax when the layer info has no tensor names
HOPS = 4  # layers followed through tensors from a softmax to the MatMuls around it


# --- the model of the layer info --------------------------------------------------------------------------

@dataclass
class Layer:
    index: int
    name: str
    type: str | None = None
    tactic: str | None = None
    metadata: str = ""
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    detailed: bool = True
    onnx: list[str] = field(default_factory=list)  # ONNX node names this layer implements
    ranges: list[tuple[str, str]] = field(default_factory=list)  # ForeignNode[first...last] spans
    note: str = ""  # metadata text that is not an ONNX node name (IAttention metadata, for one)
    kernel: str | None = None  # the fused-attention kernel this layer names, if any

    @property
    def opaque(self) -> bool:
        """A Myelin/ForeignNode layer with no kernel detail: what it contains cannot be seen."""
        return self.kernel is None and (bool(self.ranges) or bool(_OPAQUE_TYPE_RE.match(self.type or "")))

    @property
    def matmul_like(self) -> bool:
        return (self.kernel is not None or bool(_MATMUL_TYPE_RE.search(self.type or ""))
                or any(_MATMUL_OP_RE.search(_op(n)) for n in self.onnx))


@dataclass
class LayerInfo:
    source: str
    format: str  # "engine" | "json" | "log"
    layers: list[Layer]
    bindings: list[str] = field(default_factory=list)
    tensorrt: str | None = None

    @property
    def verbosity(self) -> str:
        detailed = [layer.detailed for layer in self.layers]
        if all(detailed):
            return "detailed"
        return "layer_names_only" if not any(detailed) else "mixed"

    @property
    def has_tensors(self) -> bool:
        return any(layer.inputs or layer.outputs for layer in self.layers)


def _op(onnx_name: str) -> str:
    return onnx_name.rstrip("/").rsplit("/", 1)[-1]


def _scope(onnx_name: str) -> str:
    return onnx_name.rstrip("/").rsplit("/", 1)[0].strip("/") if "/" in onnx_name else ""


def _norm(name: str) -> str:
    """Names as compared: Myelin writes `layers_0` for the ONNX `layers.0`."""
    return name.strip("/").replace(".", "_")


def _kernel_of(name: str, layer_type: str | None, tactic: str | None) -> str | None:
    if tactic and _KERNEL_RE.search(tactic):
        return tactic
    # Only the parts of the name that are not ONNX paths: module names like /encoder/mha/... are no evidence.
    bare = _FOREIGN_RE.sub(" ", name)
    tokens = [t for t in re.split(r"[\s+]+", bare) if t and "/" not in t]
    if any(_KERNEL_RE.search(t) for t in tokens):
        return name
    if layer_type and _ATTENTION_TYPE_RE.search(layer_type):
        return f"{layer_type} layer {name}"
    return None


def _names_from_layer_name(name: str) -> tuple[list[str], list[tuple[str, str]]]:
    """ONNX node names a layer name lists: `A + B`, `{ForeignNode[A...B]}`, `/x/MatMul_myl0_3`."""
    if name.startswith(("Reformatting CopyNode", "Reformatted ")):
        return [], []  # names another layer; not a node of its own
    names: list[str] = []
    ranges: list[tuple[str, str]] = []
    m = _FOREIGN_RE.search(name)
    if m:
        ends = [p.strip() for p in m.group(1).split("...")]
        if len(ends) == 2 and all(ends):
            first, last = ends[0].split(" + ")[0].strip(), ends[1].split(" + ")[-1].strip()
            ranges.append((first, last))
        for part in ends:
            names.extend(p.strip() for p in _PLUS.split(part))
        name = _FOREIGN_RE.sub(" ", name)
    names.extend(p.strip() for p in _PLUS.split(name))
    out = []
    for n in names:
        n = _MYELIN_SUFFIX.sub("", n)
        if not n or n.startswith(("__my", "__tran", "(Unnamed Layer", "PWN(", "trtattn/")) or _KERNEL_RE.search(n):
            continue
        out.append(n)
    return out, ranges


def _make_layer(index: int, name: str, layer_type: str | None = None, tactic: str | None = None,
                metadata: str | None = None, inputs=(), outputs=(), detailed: bool = True) -> Layer:
    metadata = metadata or ""
    onnx_names = [n.strip() for n in _ONNX_RE.findall(metadata) if n.strip()]
    note = _SEPARATORS.sub(" ", _ONNX_RE.sub(" ", metadata)).strip()
    from_name, ranges = _names_from_layer_name(name)
    if not onnx_names:
        onnx_names = from_name
    if note == name or _MYELIN_SUFFIX.sub("", note) == _MYELIN_SUFFIX.sub("", name):
        note = ""  # TensorRT repeats the layer name when it has no metadata of its own
    return Layer(index=index, name=name, type=layer_type, tactic=tactic, metadata=metadata,
                 inputs=[t for t in inputs if t], outputs=[t for t in outputs if t], detailed=detailed,
                 onnx=list(dict.fromkeys(onnx_names)), ranges=ranges, note=note,
                 kernel=_kernel_of(name, layer_type, tactic))


def _keep(name: str, layer_type: str | None) -> bool:
    """Layers of the first optimization profile only (TensorRT < 10 repeats them as `[profile N]`)."""
    m = _PROFILE_RE.search(name)
    if m and m.group(1) != "0":
        return False
    return (layer_type or "").lower() not in ("signal", "wait")


# --- reading the three inputs -------------------------------------------------------------------------------

def load_layer_info(path: str | Path) -> LayerInfo:
    """Layer info from an engine, a trtexec --exportLayerInfo JSON or a trtexec --dumpLayerInfo log."""
    path = Path(path)
    if not path.exists():
        raise TrtattnError(f"no such file: {path}")
    if path.is_dir():
        raise TrtattnError(f"{path} is a directory, not an engine or a layer-info file")
    if path.suffix.lower() == ".onnx":
        raise TrtattnError(f"{path} is an ONNX model; inspect reads an engine (build it first) or its layer info "
                           "(trtexec --exportLayerInfo JSON or --dumpLayerInfo log)")
    data = path.read_bytes()
    if not data.strip():
        raise TrtattnError(f"{path} is empty")
    if path.suffix.lower() in ENGINE_SUFFIXES or b"\x00" in data[:4096]:
        return read_engine(path, data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    if re.match(r"\s*(\{|\[\s*[{\"\]])", text):  # a JSON object or list (a log line starts "[11/21/2025-...")
        return parse_layer_info_json(text, str(path))
    return parse_layer_info_log(text, str(path))


def _tensor_names(value) -> list[str]:
    if not isinstance(value, list):
        return []
    return [t.get("Name", "") if isinstance(t, dict) else str(t) for t in value]


def _layers_from_json(entries: list, source: str) -> list[Layer]:
    layers: list[Layer] = []
    for entry in entries:
        if isinstance(entry, str):
            if _keep(entry, None):
                layers.append(_make_layer(len(layers), entry, detailed=False))
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("Name"), str):
            raise TrtattnError(f"{source} has a layer that is neither a name nor a record with a \"Name\"; "
                               "expected the output of trtexec --exportLayerInfo")
        layer_type = entry.get("LayerType") if isinstance(entry.get("LayerType"), str) else None
        if not _keep(entry["Name"], layer_type):
            continue
        tactic = entry.get("TacticName") or None
        if not tactic and isinstance(entry.get("TacticValue"), str) and not re.fullmatch(
                r"0x[0-9a-fA-F]+|-?\d+", entry["TacticValue"]):
            tactic = entry["TacticValue"]
        metadata = entry.get("Metadata")
        layers.append(_make_layer(len(layers), entry["Name"], layer_type, tactic if isinstance(tactic, str) else None,
                                  metadata if isinstance(metadata, str) else None,
                                  _tensor_names(entry.get("Inputs")), _tensor_names(entry.get("Outputs"))))
    return layers


def parse_layer_info_json(text: str, source: str = "<layer info>", fmt: str = "json") -> LayerInfo:
    try:
        # strict=False: TensorRT 8.6 writes raw \x1e/\x1f separators inside strings (NVIDIA/TensorRT#2779)
        data = json.loads(text, strict=False)
    except json.JSONDecodeError as e:
        raise TrtattnError(f"{source} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                           "expected the output of trtexec --exportLayerInfo") from None
    if isinstance(data, list):  # a bare list of layers (one engine's get_engine_information, pasted)
        data = {"Layers": data}
    if not isinstance(data, dict) or not isinstance(data.get("Layers"), list):
        raise TrtattnError(f"{source} has no \"Layers\" list; expected the output of trtexec --exportLayerInfo "
                           "({\"Layers\": [...], \"Bindings\": [...]})")
    layers = _layers_from_json(data["Layers"], source)
    if not layers:
        raise TrtattnError(f"{source} lists no layers (an engine built with profiling verbosity NONE?); "
                           "rebuild with --profilingVerbosity=detailed")
    bindings = [b if isinstance(b, str) else str(b) for b in data.get("Bindings", []) or []]
    return LayerInfo(source=source, format=fmt, layers=layers, bindings=bindings)


def _depth_scan(text: str):
    depth = 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        yield i, ch, depth


def _split_fields(text: str) -> list[str]:
    """Split `A: x, B: [y, z], C: w` at the top-level commas that start a new `Key: ` field."""
    parts, start = [], 0
    for i, ch, depth in _depth_scan(text):
        if ch == "," and depth == 0 and text.startswith(", ", i) and _FIELD_START.match(text, i + 2):
            parts.append(text[start:i])
            start = i + 2
    parts.append(text[start:])
    return parts


def _find_top(text: str, needle: str) -> int:
    for i, _, depth in _depth_scan(text):
        if depth == 0 and text.startswith(needle, i):
            return i
    return -1


def _oneline_tensors(value: str) -> list[str]:
    """`[ { Name: x, Dimensions: [1,2], Format/Datatype: Half }, {...}]` -> tensor names."""
    names, start, level = [], None, 0
    for i, ch in enumerate(value):
        if ch == "{":
            level += 1
            if level == 1:
                start = i + 1
        elif ch == "}" and level:
            level -= 1
            if level == 0 and start is not None:
                for part in _split_fields(value[start:i].strip()):
                    key, _, val = part.partition(": ")
                    if key.strip() == "Name":
                        names.append(val.strip())
    return names


def _parse_oneline(line: str, index: int) -> Layer | None:
    m = re.match(r"Name: (?P<name>.*?), LayerType: (?P<rest>.*)$", line)
    if not m:
        return None
    fields = {"Name": m["name"]}
    rest = "LayerType: " + m["rest"]
    at = _find_top(rest, ", Metadata: ")
    if at >= 0:
        fields["Metadata"] = rest[at + len(", Metadata: "):]
        rest = rest[:at]
    for part in _split_fields(rest):
        key, _, val = part.partition(": ")
        fields[key.strip()] = val
    if not _keep(fields["Name"], fields.get("LayerType")):
        return None
    tactic = fields.get("TacticName") or None
    if not tactic and fields.get("TacticValue") and not re.fullmatch(r"0x[0-9a-fA-F]+|-?\d+", fields["TacticValue"]):
        tactic = fields["TacticValue"]
    return _make_layer(index, fields["Name"], fields.get("LayerType"), tactic, fields.get("Metadata"),
                       _oneline_tensors(fields.get("Inputs", "")), _oneline_tensors(fields.get("Outputs", "")))


def _builder_tensors(text: str) -> list[str]:
    """`ids (Int32[1,40]), mask (Bool[1,40])` or `data[Float(-2,3,300,300)]` -> tensor names."""
    names = []
    start = 0
    for i, ch, depth in _depth_scan(text + ","):
        if ch == "," and depth == 0:
            part = text[start:i].strip()
            start = i + 1
            part = re.sub(r"\s*\([A-Za-z0-9]+\[[^\]]*\]\)$", "", part)  # name (Type[dims])
            part = re.sub(r"\[[A-Za-z0-9]+\([^)]*\)\]$", "", part)  # name[Type(dims)]
            if part:
                names.append(part)
    return names


def _parse_builder_line(line: str, index: int) -> Layer | None:
    m = _BUILDER_LINE.match(line)
    if not m:
        return None
    rest = m["rest"]
    at = rest.find(", Tactic: ")
    if at < 0:
        name, tactic, io = rest.strip(), None, ""
    else:
        name = rest[:at]
        tail = rest[at + len(", Tactic: "):]
        tactic, _, io = tail.partition(", ")
    inputs, _, outputs = io.partition(" -> ")
    tactic = tactic.strip() or None
    if tactic and re.fullmatch(r"0x[0-9a-fA-F]+|-?\d+", tactic):
        tactic = None
    if not _keep(name, m["type"]):
        return None
    layer = _make_layer(index, name, m["type"], tactic, None, _builder_tensors(inputs), _builder_tensors(outputs))
    layer.detailed = False  # these lines carry no metadata (layer names only)
    return layer


def parse_layer_info_log(text: str, source: str = "<layer info log>") -> LayerInfo:
    lines = [_LOG_PREFIX.sub("", raw.rstrip("\r")) for raw in text.splitlines()]
    prefixed = [bool(_LOG_PREFIX.match(raw)) for raw in text.splitlines()]
    layers: list[Layer] = []
    bindings: list[str] = []
    # 1. trtexec --dumpLayerInfo: "[I] Layer Information:" ... "[I] Layers:" then one line per layer.
    starts = [i for i, line in enumerate(lines) if line.strip() == "Layers:"]
    if starts:
        in_bindings = False
        for i in range(starts[0] + 1, len(lines)):
            line = lines[i].strip()
            if prefixed[i]:
                if layers or bindings:
                    break  # the log goes on with other messages
                continue  # a message printed between the header and the layers
            if not line:
                continue
            if line == "Bindings:":
                in_bindings = True
                continue
            if in_bindings:
                bindings.append(line)
                continue
            if line.startswith("Name: ") and ", LayerType: " in line:
                layer = _parse_oneline(line, len(layers))
                if layer is not None:
                    layers.append(layer)
            elif _keep(line, None):
                layers.append(_make_layer(len(layers), line, detailed=False))
    # 2. layer lines without the section header (pasted from a log)
    if not layers:
        for line in lines:
            line = line.strip()
            if line.startswith("Name: ") and ", LayerType: " in line:
                layer = _parse_oneline(line, len(layers))
                if layer is not None:
                    layers.append(layer)
    # 3. the builder's verbose "Engine Layer Information:" lines: Layer(TYPE): NAME, Tactic: ..., in -> out
    if not layers:
        for line in lines:
            layer = _parse_builder_line(line.strip(), len(layers))
            if layer is not None:
                layers.append(layer)
    if not layers:
        raise TrtattnError(f"{source} contains no layer information (no 'Layers:' section of "
                           "'Name: ..., LayerType: ...' lines); run trtexec with --dumpLayerInfo "
                           "--profilingVerbosity=detailed, or pass its --exportLayerInfo JSON")
    return LayerInfo(source=source, format="log", layers=layers, bindings=bindings)


def read_engine(path: str | Path, data: bytes | None = None) -> LayerInfo:
    """Layer info of a serialized engine through TensorRT's IEngineInspector (JSON)."""
    path = Path(path)
    from . import compat  # the one module that imports tensorrt

    try:
        trt = compat.import_tensorrt()
    except (MissingDependencyError, OSError) as e:  # not installed, or its libraries do not load
        raise MissingDependencyError(
            f"reading the engine {path.name} needs TensorRT >= 11, which cannot be imported here "
            f"({'not installed' if isinstance(e, MissingDependencyError) else type(e).__name__}; pip install "
            "--extra-index-url https://pypi.nvidia.com tensorrt-cu13, or use the docker/ container), whereas a "
            "trtexec --exportLayerInfo JSON or --dumpLayerInfo log of it is read without TensorRT") from None
    data = path.read_bytes() if data is None else data
    try:
        runtime = trt.Runtime(trt.Logger(trt.Logger.ERROR))
        engine = runtime.deserialize_cuda_engine(data)
    except Exception as e:
        raise TrtattnError(f"TensorRT {trt.__version__} could not load {path.name}: "
                           f"{' '.join(str(e).split())}") from None
    if engine is None:
        raise TrtattnError(f"TensorRT {trt.__version__} could not deserialize {path.name} (not an engine, or built "
                           "by another TensorRT version or for another GPU)")
    verbosity = getattr(engine, "profiling_verbosity", None)
    if verbosity is not None and verbosity == getattr(trt.ProfilingVerbosity, "NONE", object()):
        raise TrtattnError(f"{path.name} was built with profiling verbosity NONE, so it holds no layer information; "
                           "rebuild it with ProfilingVerbosity.DETAILED")
    inspector = engine.create_engine_inspector()
    text = inspector.get_engine_information(trt.LayerInformationFormat.JSON)
    info = parse_layer_info_json(text, str(path), fmt="engine")
    info.tensorrt = getattr(trt, "__version__", None)
    return info


def load_sites(path: str | Path) -> list[dict]:
    """The sites of a sidecar (the NAME.json `trtattn build` writes next to NAME.engine)."""
    path = Path(path)
    expected = "expected the NAME.json that trtattn build writes next to the engine ({\"sites\": [{\"name\": ...}]})"
    if not path.exists():
        raise TrtattnError(f"no such sidecar file: {path}")
    if path.is_dir():
        raise TrtattnError(f"sidecar {path} is a directory; {expected}")
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError as e:
        raise TrtattnError(f"sidecar {path} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                           f"{expected}") from None
    sites = data.get("sites") if isinstance(data, dict) else None
    if not isinstance(sites, list) or not all(isinstance(s, dict) and isinstance(s.get("name"), str) and s["name"]
                                              for s in sites):
        raise TrtattnError(f"sidecar {path} has no \"sites\" list of records with a \"name\"; {expected}")
    return sites


# --- finding and classifying the attentions -----------------------------------------------------------------

def _trtattn_sites(text: str) -> list[str]:
    text = text.replace("...", " ")  # {ForeignNode[trtattn/attn/a/q_heads...trtattn/attn/a]}
    return [_MYELIN_SUFFIX.sub("", m.group(1)) for m in _TRTATTN_RE.finditer(text)]


def _mentions(text: str, keys) -> set[str]:
    """Keys (normalised site or layer names) that `text` names as a whole: not a prefix of a longer path."""
    text = _norm(text) if text else ""
    hits = []
    for key in keys:
        start = 0
        while key and (i := text.find(key, start)) >= 0:
            j = i + len(key)
            before = text[i - 1] if i else ""
            after = text[j] if j < len(text) else ""
            if not (before.isalnum() or before == "_") and not (after.isalnum() or after in "_/#"):
                hits.append((i, j, key))
            start = i + 1
    return {k for i, j, k in hits if not any(a <= i and j <= b and b - a > j - i for a, b, _ in hits)}


@dataclass
class _Site:
    name: str
    key: str
    order: float
    core: set[int] = field(default_factory=set)
    softmax: str | None = None
    listed: bool = False  # named by the sidecar


class _Classifier:
    def __init__(self, info: LayerInfo, sites: list[dict] | None):
        self.info = info
        self.layers = info.layers
        self.sidecar = sites or []
        self.sites: dict[str, _Site] = {}
        self.other: list[dict] = []
        self.producers: dict[str, list[int]] = defaultdict(list)
        self.consumers: dict[str, list[int]] = defaultdict(list)
        for layer in self.layers:
            for t in layer.outputs:
                self.producers[t].append(layer.index)
            for t in layer.inputs:
                self.consumers[t].append(layer.index)

    def site(self, name: str, order: float) -> _Site:
        key = _norm(name)
        if key not in self.sites:
            self.sites[key] = _Site(name=name, key=key, order=order)
        site = self.sites[key]
        site.order = min(site.order, order)
        if "." in name and "." not in site.name:
            site.name = name  # prefer the ONNX spelling (layers.0) over Myelin's (layers_0)
        return site

    # -- pattern attentions: MatMul -> Softmax -> MatMul in the ONNX node names
    def find_pattern_attentions(self) -> None:
        softmaxes: dict[str, list[int]] = {}
        matmuls: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for layer in self.layers:
            for n in layer.onnx:
                op = _op(n)
                if _SOFTMAX_OP_RE.search(op):
                    softmaxes.setdefault(n, []).append(layer.index)
                elif _MATMUL_OP_RE.search(op):
                    matmuls[_norm(_scope(n))].append((layer.index, n))
            if not layer.onnx and _SOFTMAX_TYPE_RE.match(layer.type or ""):
                softmaxes.setdefault(layer.name, []).append(layer.index)
        used: dict[str, int] = defaultdict(int)
        for name, idxs in sorted(softmaxes.items(), key=lambda kv: min(kv[1])):
            first = min(idxs)
            scope = _scope(name)
            core, reason = self._core(name, scope, idxs, matmuls)
            if core is None:
                self.other.append({"name": name, "layers": [self.layers[i].name for i in sorted(set(idxs))],
                                   "reason": reason})
                continue
            base = scope if scope else name
            n = used[_norm(base)]
            used[_norm(base)] += 1
            site = self.site(base if n == 0 else f"{base}#{n}", first)
            site.core |= core
            site.softmax = name
        # ForeignNode[A...B] over the MatMul..MatMul_1 of one module: that module's attention, softmax inside.
        for layer in self.layers:
            for a, b in layer.ranges:
                if (_scope(a) and _scope(a) == _scope(b) and _MATMUL_OP_RE.search(_op(a))
                        and _MATMUL_OP_RE.search(_op(b)) and a != b):
                    if not any(s.key == _norm(_scope(a)) and layer.index in s.core for s in self.sites.values()):
                        self.site(_scope(a), layer.index).core.add(layer.index)

    def _core(self, name: str, scope: str, idxs: list[int], matmuls) -> tuple[set[int] | None, str]:
        first, last = min(idxs), max(idxs)
        core = set(idxs)
        if any(self.layers[i].kernel for i in idxs):
            return core, ""  # the softmax sits in a fused attention kernel
        if scope:
            for scopes in ([_norm(scope)], [_norm(scope), _norm(_scope("/" + scope))]):
                cands = [m for s in dict.fromkeys(scopes) for m in matmuls.get(s, [])]
                before = sorted((m for m in cands if m[0] <= first), key=lambda m: -m[0])
                after = sorted((m for m in cands if m[0] >= last), key=lambda m: m[0])
                for b in before:
                    a = next((m for m in after if m[1] != b[1]), None)
                    if a is not None:
                        return core | {b[0], a[0]}, ""
            # The module path is the ONNX-level identity of an attention: no pair of MatMuls, no attention.
            return None, f"not between two MatMuls of its module '{scope}'"
        same = {n for i in idxs for n in self.layers[i].onnx if _MATMUL_OP_RE.search(_op(n))}
        if len(same) >= 2:
            return core, ""
        # Node names without module scopes (dynamo exports: node_softmax): follow the tensors.
        if self.info.has_tensors:
            up = self._reach(idxs, up=True)
            down = self._reach(idxs, up=False)
            if up is not None and down is not None:
                return core | {up, down}, ""
            missing = " and ".join(x for x, hit in (("fed by", up), ("feeding", down)) if hit is None)
            return None, f"not {missing} a MatMul"
        # Names only, no tensors: the nearest layers on each side, in engine order.
        up = next((j for j in range(first - 1, max(-1, first - 1 - WINDOW), -1) if self._stop_or_mm(j)), None)
        down = next((j for j in range(last + 1, min(len(self.layers), last + 1 + WINDOW)) if self._stop_or_mm(j)),
                    None)
        up = up if up is not None and self.layers[up].matmul_like else None
        down = down if down is not None and self.layers[down].matmul_like else None
        if up is not None and down is not None:
            return core | {up, down}, ""
        return None, f"no MatMul within {WINDOW} layers {'before' if up is None else 'after'} it"

    def _stop_or_mm(self, j: int) -> bool:
        layer = self.layers[j]
        return layer.matmul_like or any(_SOFTMAX_OP_RE.search(_op(n)) for n in layer.onnx)

    def _reach(self, start: list[int], up: bool) -> int | None:
        seen = set(start)
        frontier = set(start)
        for _ in range(HOPS):
            nxt = set()
            for i in frontier:
                layer = self.layers[i]
                for t in (layer.inputs if up else layer.outputs):
                    for j in (self.producers if up else self.consumers).get(t, []):
                        if j in seen:
                            continue
                        seen.add(j)
                        if self.layers[j].matmul_like:
                            return j
                        if any(_SOFTMAX_OP_RE.search(_op(n)) for n in self.layers[j].onnx):
                            continue  # another softmax: not this one's MatMul
                        nxt.add(j)
            frontier = nxt
        return None

    # -- sites named by the builder (IAttention) and by the sidecar
    def map_named_sites(self) -> None:
        """trtattn build names each IAttention `trtattn/attn/<site>` (its support layers `.../<site>/q_scale`,
        ...) and sets its metadata to `trtattn site=<site> onnx=<node>`; the sidecar lists the sites."""
        keys: dict[str, str] = {}  # normalised mention -> site name
        for s in self.sidecar:
            name = s["name"]
            site = self.site(name, float("inf"))
            site.listed = True
            site.name = name
            for mention in (name, f"trtattn/attn/{name}", s.get("layer"), s.get("layer_name")):
                if isinstance(mention, str) and mention:
                    keys[_norm(mention)] = name
        known = {_norm(s["name"]): s["name"] for s in self.sidecar}
        for layer in self.layers:
            for found in _SITE_META_RE.findall(layer.note):
                known.setdefault(_norm(found), found)
        named = {_norm(f): f for layer in self.layers for f in _trtattn_sites(f"{layer.name} {layer.note}")}

        def resolve(found: str) -> str:
            """`model/layers.0/self_attn/q_scale` -> the site it belongs to (longest known prefix)."""
            key = _norm(found)
            # a known site: the longest that is a prefix; else the shortest name itself seen as trtattn/attn/...
            for pool, pick in ((known, max), (named, min)):
                prefixes = [k for k in pool if key == k or key.startswith(k + "/")]
                if prefixes:
                    return pool[pick(prefixes, key=len)]
            return found

        for layer in self.layers:
            text = f"{_MYELIN_SUFFIX.sub('', layer.name)} {layer.note}"
            hits = {keys[k] for k in _mentions(text, keys)}
            hits |= {known[_norm(f)] for f in _SITE_META_RE.findall(layer.note)}
            hits |= {resolve(f) for f in _trtattn_sites(text)}
            for name in hits:
                self.site(name, layer.index).core.add(layer.index)

    # -- fused kernels that no site claimed
    def claim_stray_kernels(self) -> None:
        claimed = {i for s in self.sites.values() for i in s.core}
        for layer in self.layers:
            if layer.kernel is None or layer.index in claimed:
                continue
            scopes = {_scope(n) for n in layer.onnx if _scope(n)}
            if len(scopes) == 1:
                name = scopes.pop()
            elif layer.note and " " not in layer.note:
                name = layer.note
            else:
                name = layer.name
            self.site(name, layer.index).core.add(layer.index)

    def report(self) -> dict:
        names_only = self.info.verbosity == "layer_names_only"
        attention, failures = [], []
        for site in sorted(self.sites.values(), key=lambda s: (s.order, s.name)):
            layers = [self.layers[i] for i in sorted(site.core)]
            kernels = [layer.kernel for layer in layers if layer.kernel]
            row = {"site": site.name, "fused": bool(kernels), "layers": [layer.name for layer in layers],
                   "kernel": kernels[0] if kernels else None}
            if kernels:
                row["status"] = "fused"
            elif not layers:
                row["status"] = "missing"
                row["reason"] = "listed in the sidecar but not found in the layer info"
                failures.append(f"{site.name}: {row['reason']}")
            else:
                row["status"] = "not fused"
                types = ", ".join(dict.fromkeys(layer.type for layer in layers if layer.type)) or "layers"
                if names_only:
                    row["reason"] = ("layer info has layer names only, no kernels "
                                     "(rebuild with --profilingVerbosity=detailed)")
                else:
                    row["reason"] = f"no fused attention kernel: runs as {len(layers)} layer(s) ({types})"
                failures.append(f"{site.name}: not fused ({row['reason']})")
            row["listed_in_sidecar"] = site.listed
            if site.softmax:
                row["softmax"] = site.softmax
            attention.append(row)
        claimed = {i for s in self.sites.values() for i in s.core}
        opaque = [layer.name for layer in self.layers if layer.opaque and layer.index not in claimed]
        if opaque and not attention:
            failures.append(f"{len(opaque)} Myelin/ForeignNode layer(s) without kernel detail may hide attention; "
                            "rebuild with --profilingVerbosity=detailed")
        fused = sum(r["fused"] for r in attention)
        missing = [r["site"] for r in attention if r["status"] == "missing"]
        summary = {"attention": len(attention), "fused": fused,
                   "not_fused": len(attention) - fused - len(missing), "missing": missing,
                   "other_softmax": len(self.other), "opaque_layers": opaque, "layers": len(self.layers),
                   "verbosity": self.info.verbosity, "failures": failures, "ok": not failures}
        return {"source": self.info.source, "format": self.info.format, "tensorrt": self.info.tensorrt,
                "attention": attention, "other_softmax": self.other, "summary": summary}


def classify(info: LayerInfo, sites: list[dict] | None = None) -> dict:
    """The report: one row per attention (fused or not, its layers and kernel), the other softmaxes, a summary."""
    c = _Classifier(info, sites)
    c.find_pattern_attentions()
    c.map_named_sites()
    c.claim_stray_kernels()
    return c.report()


# --- output and the command ---------------------------------------------------------------------------------

def _short(names: list[str], limit: int = 2, width: int = 60) -> str:
    cut = [n if len(n) <= width else n[: width - 3] + "..." for n in names[:limit]]
    more = len(names) - limit
    return ", ".join(cut) + (f" (+{more} more)" if more > 0 else "")


def render_table(report: dict) -> str:
    from ..report import table

    rows = [{"site": r["site"], "status": r["status"],
             "kernel": (r["kernel"] if len(r["kernel"] or "") <= 48 else r["kernel"][:45] + "...") if r["kernel"]
             else None,
             "layers": _short(r["layers"]) if r["layers"] else "-"} for r in report["attention"]]
    columns = [("site", "site"), ("status", "fused"), ("kernel", "kernel"), ("layers", "layers")]
    if any(r["listed_in_sidecar"] for r in report["attention"]):
        columns.insert(2, ("sidecar", "sidecar"))
        for row, r in zip(rows, report["attention"]):
            row["sidecar"] = r["listed_in_sidecar"]
    out = []
    if rows:
        out.append(table(rows, columns))
    for r in report["attention"]:
        if r.get("reason") and r["status"] != "fused":
            out.append(f"  {r['site']}: {r['reason']}")
    for s in report["other_softmax"]:
        out.append(f"other softmax (not attention): {s['name']}: {s['reason']}")
    summary = report["summary"]
    if summary["opaque_layers"]:
        out.append(f"opaque layers (no kernel detail): {_short(summary['opaque_layers'], 3)}")
    line = (f"{summary['attention']} attention site(s): {summary['fused']} fused, {summary['not_fused']} not fused"
            + (f", {len(summary['missing'])} missing" if summary["missing"] else "")
            + f"; {summary['other_softmax']} other softmax; {summary['layers']} layers "
              f"({summary['verbosity'].replace('_', ' ')}) from {report['format']} {report['source']}")
    out.append(line)
    return "\n".join(out)


def add_inspect_parser(subparsers) -> argparse.ArgumentParser:
    """Adds `inspect` to a subparsers object (cli.build_parser's `sub`)."""
    p = subparsers.add_parser(
        "inspect", help="prove from an engine's layer info that every attention runs as a fused kernel",
        description="Classify every attention of an engine as fused (an mha/fmha kernel in its layer info) or not.")
    p.add_argument("source", metavar="ENGINE|LAYERINFO",
                   help="a serialized engine (needs TensorRT), a trtexec --exportLayerInfo JSON or a trtexec "
                        "--dumpLayerInfo log (both best with --profilingVerbosity=detailed)")
    p.add_argument("--sites", metavar="SIDECAR.json",
                   help="the sidecar trtattn build writes next to the engine: its sites must all be found")
    p.add_argument("--require-fused", action="store_true",
                   help="exit 1 unless every attention is fused and every sidecar site is found")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def run_inspect(args) -> int:
    info = load_layer_info(args.source)
    sites = load_sites(args.sites) if getattr(args, "sites", None) else None
    report = classify(info, sites)
    if getattr(args, "json", False):
        print(json.dumps(report, indent=2))
    else:
        print(render_table(report))
    failures = report["summary"]["failures"]
    if getattr(args, "require_fused", False) and failures:
        if not getattr(args, "json", False):
            print("not every attention is fused: " + "; ".join(failures))
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m trtattn.trt.inspect ...`: the command on its own, with the CLI's error conventions."""
    ap = argparse.ArgumentParser(prog="trtattn")
    add_inspect_parser(ap.add_subparsers(dest="command", required=True))
    args = ap.parse_args(["inspect", *(sys.argv[1:] if argv is None else argv)])
    try:
        return run_inspect(args)
    except TrtattnError as e:
        print(f"trtattn: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
