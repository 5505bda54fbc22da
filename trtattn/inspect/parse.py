"""Reading layer info into one LayerInfo, from any of the three shapes TensorRT publishes it in:

- a serialized engine, read through TensorRT's IEngineInspector (JSON format; trtattn.trt.inspector, loaded
  only for engines);
- a trtexec ``--exportLayerInfo=f.json`` file: ``{"Layers": [...], "Bindings": [...]}``, each layer a dict
  (``--profilingVerbosity=detailed``) or only a name (layer-names-only verbosity);
- a trtexec ``--dumpLayerInfo`` log: the ``Layers:`` section of one ``Name: ..., LayerType: ...`` line per
  layer (kONELINE format), or the builder's verbose ``Layer(TYPE): NAME, Tactic: ...`` lines ("Engine Layer
  Information").

And the sites of a sidecar (the NAME.json `trtattn build` writes next to NAME.engine).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..contract import is_engine_path
from ..errors import TrtattnError
from .layers import Layer, LayerInfo, keep_layer, make_layer

_LOG_PREFIX = re.compile(r"^\[\d{2}/\d{2}/\d{4}-\d{2}:\d{2}:\d{2}\] \[[A-Z]\] (?:\[TRT\] )?")
_BUILDER_LINE = re.compile(r"^Layer\((?P<type>[^)]*)\): (?P<rest>.*)$")
_FIELD_START = re.compile(r"[A-Za-z][\w/]*: ")
_BUILDER_TENSOR = re.compile(r"^(?P<name>.*?)(?:\s*\((?P<a>[A-Za-z0-9]+)\[[^\]]*\]\)"  # name (Type[dims])
                             r"|\[(?P<b>[A-Za-z0-9]+)\([^)]*\)\])$")  # name[Type(dims)]
_NUMERIC_TACTIC = re.compile(r"0x[0-9a-fA-F]+|-?\d+")  # a tactic given only as a number names no kernel


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
    if is_engine_path(path) or b"\x00" in data[:4096]:
        return read_engine(path, data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    if re.match(r"\s*(\{|\[\s*[{\"\]])", text):  # a JSON object or list (a log line starts "[11/21/2025-...")
        return parse_layer_info_json(text, str(path))
    return parse_layer_info_log(text, str(path))


def read_engine(path: str | Path, data: bytes | None = None) -> LayerInfo:
    """Layer info of a serialized engine (needs TensorRT)."""
    from ..trt.inspector import engine_layer_info  # tensorrt is loaded for engines only

    text, version = engine_layer_info(path, data)
    info = parse_layer_info_json(text, str(path), fmt="engine")
    info.tensorrt = version
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


def _named_tactic(tactic, tactic_value) -> str | None:
    """TacticName, else a TacticValue that is a name rather than a number."""
    if isinstance(tactic, str) and tactic:
        return tactic
    if isinstance(tactic_value, str) and tactic_value and not _NUMERIC_TACTIC.fullmatch(tactic_value):
        return tactic_value
    return None


# --- JSON (trtexec --exportLayerInfo, IEngineInspector) -------------------------------------------------------

def _tensor_names(value) -> list[str]:
    if not isinstance(value, list):
        return []
    return [t.get("Name", "") if isinstance(t, dict) else str(t) for t in value]


def _tensor_formats(value) -> list[str]:
    if not isinstance(value, list):
        return []
    return [t["Format/Datatype"] for t in value if isinstance(t, dict) and isinstance(t.get("Format/Datatype"), str)]


def _layers_from_json(entries: list, source: str) -> list[Layer]:
    layers: list[Layer] = []
    for entry in entries:
        if isinstance(entry, str):
            if keep_layer(entry, None):
                layers.append(make_layer(len(layers), entry, detailed=False))
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("Name"), str):
            raise TrtattnError(f"{source} has a layer that is neither a name nor a record with a \"Name\"; "
                               "expected the output of trtexec --exportLayerInfo")
        layer_type = entry.get("LayerType") if isinstance(entry.get("LayerType"), str) else None
        if not keep_layer(entry["Name"], layer_type):
            continue
        metadata = entry.get("Metadata")
        layers.append(make_layer(len(layers), entry["Name"], layer_type,
                                 _named_tactic(entry.get("TacticName"), entry.get("TacticValue")),
                                 metadata if isinstance(metadata, str) else None,
                                 _tensor_names(entry.get("Inputs")), _tensor_names(entry.get("Outputs")),
                                 input_formats=_tensor_formats(entry.get("Inputs")),
                                 output_formats=_tensor_formats(entry.get("Outputs"))))
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
    return LayerInfo(source=source, format=fmt, layers=layers)


# --- logs (trtexec --dumpLayerInfo, the builder's verbose layer lines) ----------------------------------------

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


def _oneline_tensors(value: str) -> tuple[list[str], list[str]]:
    """`[ { Name: x, Dimensions: [1,2], Format/Datatype: Half }, {...}]` -> (tensor names, their formats)."""
    names, formats, start, level = [], [], None, 0
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
                    elif key.strip() == "Format/Datatype":
                        formats.append(val.strip())
    return names, formats


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
    if not keep_layer(fields["Name"], fields.get("LayerType")):
        return None
    (inputs, input_formats), (outputs, output_formats) = (_oneline_tensors(fields.get(side, ""))
                                                          for side in ("Inputs", "Outputs"))
    return make_layer(index, fields["Name"], fields.get("LayerType"),
                      _named_tactic(fields.get("TacticName"), fields.get("TacticValue")), fields.get("Metadata"),
                      inputs, outputs, input_formats=input_formats, output_formats=output_formats)


def _builder_tensors(text: str) -> tuple[list[str], list[str]]:
    """`ids (Int32[1,40]), mask (Bool[1,40])` or `data[Float(-2,3,300,300)]` -> (tensor names, their types)."""
    names, types = [], []
    start = 0
    for i, ch, depth in _depth_scan(text + ","):
        if ch == "," and depth == 0:
            part = text[start:i].strip()
            start = i + 1
            m = _BUILDER_TENSOR.match(part)
            if m:
                part = m["name"]
                types.append(m["a"] or m["b"])
            if part:
                names.append(part)
    return names, types


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
    input_text, _, output_text = io.partition(" -> ")
    if not keep_layer(name, m["type"]):
        return None
    (inputs, input_types), (outputs, output_types) = _builder_tensors(input_text), _builder_tensors(output_text)
    # these lines carry no metadata (layer names only)
    return make_layer(index, name, m["type"], _named_tactic(None, (tactic or "").strip()), None, inputs, outputs,
                      detailed=False, input_formats=input_types, output_formats=output_types)


def _dump_layer_info_section(lines: list[str], prefixed: list[bool]) -> list[Layer]:
    """trtexec --dumpLayerInfo: "[I] Layer Information:" ... "[I] Layers:" then one line per layer, then
    "Bindings:" and its tensor names (skipped)."""
    starts = [i for i, line in enumerate(lines) if line.strip() == "Layers:"]
    layers: list[Layer] = []
    if not starts:
        return layers
    in_bindings = seen_bindings = False
    for i in range(starts[0] + 1, len(lines)):
        line = lines[i].strip()
        if prefixed[i]:
            if layers or seen_bindings:
                break  # the log goes on with other messages
            continue  # a message printed between the header and the layers
        if not line:
            continue
        if line == "Bindings:":
            in_bindings = True
            continue
        if in_bindings:
            seen_bindings = True
            continue
        if line.startswith("Name: ") and ", LayerType: " in line:
            layer = _parse_oneline(line, len(layers))
            if layer is not None:
                layers.append(layer)
        elif keep_layer(line, None):
            layers.append(make_layer(len(layers), line, detailed=False))
    return layers


def parse_layer_info_log(text: str, source: str = "<layer info log>") -> LayerInfo:
    lines = [_LOG_PREFIX.sub("", raw.rstrip("\r")) for raw in text.splitlines()]
    prefixed = [bool(_LOG_PREFIX.match(raw)) for raw in text.splitlines()]
    # 1. the --dumpLayerInfo section
    layers = _dump_layer_info_section(lines, prefixed)
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
    return LayerInfo(source=source, format="log", layers=layers)
