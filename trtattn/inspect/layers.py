"""The model of an engine's layer info, whatever it was read from: one Layer per engine layer, with the ONNX
nodes it implements, the fused-attention kernel it names, if any, and the types of its tensors.

Only kernel and tactic names are kernel evidence: module names such as ``.../mha/...`` inside ONNX paths never
are (NVIDIA/TensorRT#4397).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..site_names import PREFIX
from .precision import dtype_of

# `_gemm_mha_v2_myl0_17`, TacticName `_gemm_mha_v2_0x957a...`, `fmha_v2_flash_attention_fp16_...`,
# `sm80_fmha_...`: the token mha/fmha (or flash attention) standing on its own between separators.
_KERNEL_RE = re.compile(r"(?i)(?:^|[^a-z0-9])(f?mha|flash_?att(?:ention|n)?)(?=$|[^a-z])")
# an attention layer type, but not IAttention's input/output markers
_ATTENTION_TYPE_RE = re.compile(r"(?i)^(?!.*(?:input|output|boundary)).*attention|^f?mha$")
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
_PLUS = re.compile(r"\s+\+\s+|\+(?=/)")  # `A + B`; Myelin names join ONNX paths with a bare `+`


@dataclass
class Layer:
    index: int
    name: str
    type: str | None = None
    tactic: str | None = None
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    detailed: bool = True
    onnx: list[str] = field(default_factory=list)  # ONNX node names this layer implements
    ranges: list[tuple[str, str]] = field(default_factory=list)  # ForeignNode[first...last] spans
    note: str = ""  # metadata text that is not an ONNX node name (IAttention metadata, for one)
    kernel: str | None = None  # the fused-attention kernel its tactic or name names, if any
    input_dtypes: list[str] = field(default_factory=list)  # its tensors' types (fp16, fp8, int32 ...), where given
    output_dtypes: list[str] = field(default_factory=list)

    @property
    def attention_type(self) -> bool:
        """The layer's type is an attention (TensorRT's IAttention, an MHA layer): no kernel named."""
        return bool(self.type and _ATTENTION_TYPE_RE.search(self.type))

    @property
    def evidence(self) -> str | None:
        """What says this layer is an attention: its kernel, else its attention layer type (which finds the
        attention but does not prove it fused: classify.py asks for the kernel)."""
        if self.kernel is not None:
            return self.kernel
        return f"{self.type} layer {self.name}" if self.attention_type else None

    @property
    def opaque(self) -> bool:
        """A Myelin/ForeignNode layer with no kernel detail: what it contains cannot be seen."""
        return self.evidence is None and (bool(self.ranges) or bool(_OPAQUE_TYPE_RE.match(self.type or "")))

    @property
    def matmul_like(self) -> bool:
        return (self.evidence is not None or bool(_MATMUL_TYPE_RE.search(self.type or ""))
                or any(is_matmul_op(n) for n in self.onnx))

    @property
    def softmax_type(self) -> bool:
        return bool(_SOFTMAX_TYPE_RE.match(self.type or ""))

    @property
    def runs_softmax(self) -> bool:
        return any(is_softmax_op(n) for n in self.onnx)


@dataclass
class LayerInfo:
    source: str
    format: str  # "engine" | "json" | "log"
    layers: list[Layer]
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


# --- ONNX node names as layer info spells them --------------------------------------------------------------

def op_of(onnx_name: str) -> str:
    """`/model/layers.0/self_attn/MatMul_1` -> `MatMul_1`."""
    return onnx_name.rstrip("/").rsplit("/", 1)[-1]


def scope_of(onnx_name: str) -> str:
    """`/model/layers.0/self_attn/MatMul_1` -> `model/layers.0/self_attn` (the module); "" without one."""
    return onnx_name.rstrip("/").rsplit("/", 1)[0].strip("/") if "/" in onnx_name else ""


def norm(name: str) -> str:
    """Names as compared: Myelin writes `layers_0` for the ONNX `layers.0`."""
    return name.strip("/").replace(".", "_")


def is_softmax_op(onnx_name: str) -> bool:
    return bool(_SOFTMAX_OP_RE.search(op_of(onnx_name)))


def is_matmul_op(onnx_name: str) -> bool:
    return bool(_MATMUL_OP_RE.search(op_of(onnx_name)))


def strip_myelin_suffix(name: str) -> str:
    """`/x/MatMul_myl0_3` -> `/x/MatMul`."""
    return _MYELIN_SUFFIX.sub("", name)


# --- one layer from its fields ----------------------------------------------------------------------------

def _kernel_of(name: str, tactic: str | None) -> str | None:
    if tactic and _KERNEL_RE.search(tactic):
        return tactic
    # Only the parts of the name that are not ONNX paths: module names like /encoder/mha/... are no evidence.
    bare = _FOREIGN_RE.sub(" ", name)
    tokens = [t for t in re.split(r"[\s+]+", bare) if t and "/" not in t]
    if any(_KERNEL_RE.search(t) for t in tokens):
        return name
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
        n = strip_myelin_suffix(n)
        if not n or n.startswith(("__my", "__tran", "(Unnamed Layer", "PWN(", f"{PREFIX}/")) or _KERNEL_RE.search(n):
            continue
        out.append(n)
    return out, ranges


def make_layer(index: int, name: str, layer_type: str | None = None, tactic: str | None = None,
               metadata: str | None = None, inputs=(), outputs=(), detailed: bool = True,
               input_formats=(), output_formats=()) -> Layer:
    """A Layer from the fields every layer-info format has (metadata: TensorRT's `[ONNX Layer: ...]` text;
    formats: each tensor's Format/Datatype, as written)."""
    metadata = metadata or ""
    onnx_names = [n.strip() for n in _ONNX_RE.findall(metadata) if n.strip()]
    note = _SEPARATORS.sub(" ", _ONNX_RE.sub(" ", metadata)).strip()
    from_name, ranges = _names_from_layer_name(name)
    if not onnx_names:
        onnx_names = from_name
    if note == name or strip_myelin_suffix(note) == strip_myelin_suffix(name):
        note = ""  # TensorRT repeats the layer name when it has no metadata of its own
    return Layer(index=index, name=name, type=layer_type, tactic=tactic,
                 inputs=[t for t in inputs if t], outputs=[t for t in outputs if t], detailed=detailed,
                 onnx=list(dict.fromkeys(onnx_names)), ranges=ranges, note=note, kernel=_kernel_of(name, tactic),
                 input_dtypes=_dtypes(input_formats), output_dtypes=_dtypes(output_formats))


def _dtypes(formats) -> list[str]:
    return [t for t in map(dtype_of, formats) if t]


def keep_layer(name: str, layer_type: str | None) -> bool:
    """Layers of the first optimization profile only (TensorRT < 10 repeats them as `[profile N]`)."""
    m = _PROFILE_RE.search(name)
    if m and m.group(1) != "0":
        return False
    return (layer_type or "").lower() not in ("signal", "wait")
