"""AttentionSite: the one record the matcher produces and every back end consumes.

A site names graph tensors and carries everything a back end needs to rewrite the attention
without looking at the graph again. All tensor fields are tensor names in the ONNX graph.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field

# Soft-capping, cap * tanh(logits / cap) before the mask: AttentionSite.softcap holds a site's cap (matched from the
# graph by match/logit_ops/softcap.py, or read from a fused op's attribute), and this attribute of the ONNX
# Attention op (and com.microsoft's GroupQueryAttention) carries it; IAttention has no such step.
SOFTCAP_ATTRIBUTE = "softcap"
SOFTCAP_WHY = "its logits are soft-capped (tanh), which IAttention cannot do"  # a capped site's reason, one wording


def attribute_softcap(attrs) -> float | None:
    """The cap a fused attention op's attributes set; None when absent or 0 (the spec's "no soft-cap")."""
    return float(attrs.get(SOFTCAP_ATTRIBUTE, 0.0) or 0.0) or None


class Layout(str, enum.Enum):
    """Layout of a 4-D attention operand; B batch, N heads, S sequence, H head size."""

    BNSH = "BNSH"  # what IAttention's PADDED_BHND and ONNX Attention take
    BSNH = "BSNH"
    BNHS = "BNHS"  # a pre-transposed key (K^T)
    PACKED = "NHD"  # [total_tokens, N, H]


class SiteKind(str, enum.Enum):
    SELF = "self"
    CROSS = "cross"
    UNKNOWN = "unknown"  # Q or K given as graph inputs, unprojected: the graph does not say whether one sequence


class ScalePlacement(str, enum.Enum):
    """Where the exported graph applied the softmax scale."""

    NONE = "none"  # no scale anywhere (T5): the logits are unscaled
    AFTER_BMM1 = "after_bmm1"  # Div or Mul on Q.K^T (what TensorRT does not want)
    ON_Q = "on_q"  # Mul on Q before the first MatMul (what TensorRT wants)
    ON_K = "on_k"
    SQRT_ON_QK = "sqrt_on_qk"  # sqrt(scale) on both Q and K (torch's SDPA export)
    MIXED = "mixed"  # several of the above multiplied together
    ATTRIBUTE = "attribute"  # already a fused op with a scale attribute


class MaskKind(str, enum.Enum):
    NONE = "none"
    ADDITIVE = "additive"  # float tensor added to the logits
    BOOLEAN = "boolean"  # True = may attend


class CausalKind(str, enum.Enum):
    """Alignment of an implicit causal mask (IAttention's CausalMaskKind)."""

    NONE = "none"
    UPPER_LEFT = "upper_left"  # j <= i
    LOWER_RIGHT = "lower_right"  # j <= i + Skv - Sq (decode with a cache)


class CacheKind(str, enum.Enum):
    NONE = "none"
    CONCAT = "concat"  # K/V = Concat(past, new) along the sequence axis
    CROSS_STATIC = "cross_static"  # K/V read from graph inputs as they are, computed once (cross-attention's
    # when the graph projects the query; SiteKind says)


class RopeKind(str, enum.Enum):
    NONE = "none"
    HALF_SPLIT = "half_split"  # HF rotate_half
    INTERLEAVED = "interleaved"  # GPT-J style adjacent pairs


class SiteSource(str, enum.Enum):
    """What the matcher read a site from; it picks the rewriter fuse writes the site with (rewrite/fuse.py).
    str-valued, and str() is the value: reports and messages keep the strings ("onnx:Attention")."""

    PATTERN = "pattern"  # a decomposed attention (MatMul, Softmax, MatMul) found by what its axes mean
    ONNX_ATTENTION = "onnx:Attention"  # the standard op already (opset 23)
    # com.microsoft's attention ops (match/fused_ops.MICROSOFT_OPS): converted, or listed with why
    MS_ATTENTION = "com.microsoft:Attention"
    MS_QATTENTION = "com.microsoft:QAttention"
    MS_MULTI_HEAD = "com.microsoft:MultiHeadAttention"
    MS_GROUP_QUERY = "com.microsoft:GroupQueryAttention"
    MS_PACKED = "com.microsoft:PackedAttention"
    MS_PACKED_MULTI_HEAD = "com.microsoft:PackedMultiHeadAttention"
    MS_DECODER_MASKED_MULTI_HEAD = "com.microsoft:DecoderMaskedMultiHeadAttention"
    MS_DECODER_MASKED_SELF = "com.microsoft:DecoderMaskedSelfAttention"
    MS_QORDERED = "com.microsoft:QOrderedAttention"
    MS_DECODER = "com.microsoft:DecoderAttention"
    MS_SPARSE = "com.microsoft:SparseAttention"
    MS_PAGED = "com.microsoft:PagedAttention"
    MS_LONGFORMER = "com.microsoft:LongformerAttention"

    @classmethod
    def contrib(cls, op: str) -> SiteSource:
        """The source of com.microsoft's attention op `op`."""
        return cls(f"com.microsoft:{op}")

    def __str__(self) -> str:
        return self.value

    @property
    def is_contrib(self) -> bool:
        return self.value.startswith("com.microsoft:")

    @property
    def is_op(self) -> bool:
        """Already a fused attention op (standard or contrib), not a decomposed pattern."""
        return self != SiteSource.PATTERN


class SiteStatus(str, enum.Enum):
    """What became of a site in a rewrite (str-valued: reports and JSON keep the strings)."""

    FUSED = "fused"  # fuse: the fused op, verified
    NOT_FUSED = "not fused"  # fuse: left exactly as it was; the report's reason says why
    REWRITTEN = "rewritten"  # normalize: rewritten into TensorRT's form, verified
    KEPT = "kept"  # normalize: left as it was, nothing to improve (the reason says why)
    SKIPPED = "skipped"  # normalize: an attention it could not rewrite, left as it was (the reason says why)

    @property
    def changed(self) -> bool:
        """The site was rewritten (fused or normalized)."""
        return self in (SiteStatus.FUSED, SiteStatus.REWRITTEN)

    @property
    def failed(self) -> bool:
        """An attention the rewrite wanted and could not take: the run is not ok."""
        return self in (SiteStatus.NOT_FUSED, SiteStatus.SKIPPED)


@dataclass(frozen=True)
class MaskStep:
    """One op between the first product and the Softmax that changes the logits.

    op: "add" | "sub" (operand added/subtracted), "where" (Where(cond, logits, fill)),
        "where_not" (Where(cond, fill, logits)), "scale" (multiply by `value`),
        "reshape" (operand is the target shape tensor), "softcap" (cap * tanh(x / cap), cap in `value`).
    """

    op: str
    operand: str | None = None  # tensor name: the bias, condition or shape
    value: float | None = None  # scale factor, fill value or cap
    node: str | None = None  # the node that applied it (for messages)
    frame: tuple | None = None  # the operand's axes as atoms (see SiteLayout), right-aligned to its rank


@dataclass(frozen=True)
class QuantParams:
    """A per-tensor QuantizeLinear -> DequantizeLinear pair: what an int8/fp8 IAttention takes."""

    dtype: str  # the quantized type ("int8", "uint8", "float8_e4m3fn", ...)
    scale: float
    zero_point: int = 0


@dataclass(frozen=True)
class SiteQuant:
    """The Q/DQ pairs around a quantized attention. The fused op keeps those on Q, K and V outside it;
    those on the logits and after the softmax it drops (TensorRT re-applies `probs` as IAttention's
    normalization quantize)."""

    query: QuantParams | None = None
    key: QuantParams | None = None
    value: QuantParams | None = None
    logits: QuantParams | None = None
    probs: QuantParams | None = None


@dataclass(frozen=True)
class SiteLayout:
    """How the fused op reads the graph, by what each axis means.

    A frame gives each axis of a tensor the *atoms* it holds, merged row-major: x0, x1, ... batch
    (x0.1: part of a split x0), q and k query and key positions, d the head dim of Q and K, e V's.
    The fused op sees Q as [batch, heads, q, d], K as [batch, kv_heads, k, d], V as [batch, kv_heads,
    k, e] and gives [batch, heads, q, e] in place of `output` (whose frame is `out`).
    """

    query: str  # the tensors the fused op reads (Q/DQ and layout ops above the products stay outside)
    key: str
    value: str
    q: tuple
    k: tuple
    v: tuple
    out: tuple
    batch: tuple[str, ...]  # atoms merged into the op's batch axis
    heads: tuple[str, ...]  # Q's heads atoms (empty: one head per batch row)
    kv_heads: tuple[str, ...]  # K/V's (a prefix of `heads` under GQA)
    dims: tuple = ()  # (atom, ("static", n) | ("axis", tensor, axis) | ("entry", shape, i)
    #               | ("part", recipe, divisor: an int or a recipe))
    shape_reads: tuple = ()  # (a Shape output, frame of the tensor it reads): shapes of tensors that go away
    scale: float = 1.0  # the op's scale: what multiplies query . key^T as read here
    qk: tuple = ()  # frame of the site's qk_output (AttentionSite), which the op's [batch, heads, q, k] output becomes
    # which of "q", "k", "v" hold size 1 where the batch is (a learned probe [1, Q, D] the product broadcasts
    # over the batch): the fused op takes one batch for all three, so the rewrite expands them
    batch_broadcast: tuple[str, ...] = ()
    qk_dtype: str | None = None  # the element type of the site's qk_output (the op's is its own: a Cast follows)

    @property
    def scores(self) -> tuple:
        return (self.batch, self.heads, ("q",), ("k",))


@dataclass(frozen=True)
class Rope:
    kind: RopeKind
    rotary_dim: int  # number of rotated channels (== head size unless partial)
    cos: str  # tensor names of the cos/sin tables as the graph computes them
    sin: str
    q_input: str  # Q and K before the rotation (BNSH)
    k_input: str
    position_ids: str | None = None
    interleaved: bool = False
    # read by what it computes (match/rotation.py): cos/sin are RotaryEmbedding's own caches ([max_pos, R/2]
    # indexed by position_ids, or [B, S, R/2]), and fuse writes the op in place of q_output and k_output
    op_caches: bool = False
    q_output: str | None = None
    k_output: str | None = None
    num_heads: int = 0  # a 3-D input's heads (the op's num_heads); 0 for 4-D
    rotary_embedding_dim: int = 0  # the op's attribute: 0 when the whole head rotates


@dataclass(frozen=True)
class MadeNode:
    """A node the matcher's proof of a partitioned key axis adds (match/partition.py): the rewrite writes it
    again, by these names, in a graph read afresh."""

    op: str
    inputs: tuple[str, ...]
    output: str
    attrs: tuple[tuple[str, int | tuple[int, ...]], ...] = ()


@dataclass(frozen=True)
class CacheLength:
    """A graph input the graph concatenates onto a site's keys along their key axis (a cache it appends to, kept
    whole or as a window of the last positions): verified at an empty cache and at a step over a past (graph/dims.py
    with_cache_steps)."""

    input: str
    past: str  # the dim name of the input's key axis: the cache length
    new: str | None  # the dim name of the new keys' length (the other part), None where no graph input names it


@dataclass(frozen=True)
class KeyPartition:
    """An attention written over blocks of its key axis (match/partition.py): logits concatenated from the
    products with K_i, probabilities sliced back into the same blocks, each multiplied by its V_i, summed.
    `key`/`value` name Concat(K_i)/Concat(V_i) (the nodes in `made`), which the site reads."""

    softmax: str
    keys: tuple[str, ...]  # K_i as the first products read them, in key order
    values: tuple[str, ...]  # V_i as the second products read them
    bounds: tuple[tuple[int, int | None], ...]  # each block's [start, end) on the key axis (None: to the end)
    key: str
    value: str
    made: tuple[MadeNode, ...]

    def note(self) -> str:
        spans = ", ".join(f"{a}:{'' if b is None else b}" for a, b in self.bounds)
        return (f"key axis written in {len(self.keys)} blocks ({spans}): one attention over Concat"
                f"({', '.join(self.keys)}) and Concat({', '.join(self.values)})")


@dataclass(frozen=True)
class AttentionSite:
    name: str
    kind: SiteKind
    # operands, as fed to the attention (K/V after the cache concat, before any GQA head repeat)
    query: str
    key: str
    value: str
    output: str  # the attention result replaced by a back end
    q_layout: Layout = Layout.BNSH
    k_layout: Layout = Layout.BNSH
    v_layout: Layout = Layout.BNSH
    output_layout: Layout = Layout.BNSH
    q_heads: int | None = None
    kv_heads: int | None = None
    head_size: int | None = None
    v_head_size: int | None = None
    scale: float = 1.0  # the factor a back end applies to query . key^T (the operands as named here)
    prescale: float = 1.0  # a factor already applied upstream of `query` (Whisper scales q_proj's output)
    scale_placement: ScalePlacement = ScalePlacement.NONE
    mask: MaskKind = MaskKind.NONE
    mask_steps: tuple[MaskStep, ...] = ()  # how the logits are masked, in graph order
    causal: CausalKind = CausalKind.NONE
    window: int | None = None  # sliding-window size when the mask is a local band
    padding: bool = False  # the mask depends on a padding-mask input
    cache: CacheKind = CacheKind.NONE
    past_key: str | None = None
    past_value: str | None = None
    new_key: str | None = None  # K/V of the current step (the concat's second operand)
    new_value: str | None = None
    rope: Rope | None = None
    key_perm: tuple[int, ...] | None = None  # Transpose that turns `key` into BNSH (None: it is BNSH)
    key_transposed: str | None = None  # K^T as the first MatMul reads it, adjacent K-side scale stripped
    key_transposed_scale: float = 1.0  # a scale still inside `key_transposed` (applied before a Transpose)
    logits_cast: int | None = None  # ONNX dtype of a float Cast on the logits (mixed-precision softmax)
    rank: int = 4  # rank of the MatMuls (3 for [B*N, S, H] exports)
    source: SiteSource = SiteSource.PATTERN
    softmax: str | None = None  # node name of the Softmax (pattern sites)
    dtype: str = "float32"
    products_dtype: str | None = None  # fp16/bf16 when the original's products compute in it (Casts around them)
    notes: tuple[str, ...] = ()
    layout: SiteLayout | None = None  # pattern sites: the fused op's operands by axis meaning
    softcap: float | None = None  # logit soft-cap (Attention's softcap; IAttention has none)
    quant: SiteQuant | None = None  # Q/DQ pairs around a quantized attention
    graph: tuple = ()  # the subgraph holding the site: ((node output, attribute), ...); () the main graph
    # a tensor of the site the model also returns, written as the op's qk_matmul_output with qk_mode (the op's
    # qk_matmul_output_mode; 3: the probabilities after the softmax and the op's fully-masked-row guard). IAttention
    # outputs only Y: the TensorRT route computes it beside IAttention (routes/prepare/qk_beside.py)
    qk_output: str | None = None
    qk_mode: int | None = None
    # the single-head sites (by name, in head order) this multi-head site was merged from (match/heads_merge.py)
    merged: tuple[str, ...] = ()
    partition: KeyPartition | None = None  # K and V concatenated from the key blocks the graph multiplies apart
    cache_lengths: tuple[CacheLength, ...] = ()  # graph inputs concatenated onto the keys (match/cache.py)

    def replace(self, **changes) -> AttentionSite:
        return dataclasses.replace(self, **changes)

    @property
    def softmax_scale(self) -> float:
        """The softmax scale of the original attention, wherever the graph applied it."""
        return self.scale * self.prescale

    @property
    def op_bias(self) -> bool:
        """A contrib op's own attention_bias input (read from the op, not probed: match/fused_ops.py)."""
        return self.source.is_contrib and any(s.op == "add" for s in self.mask_steps)

    @property
    def gqa(self) -> bool:
        return bool(self.q_heads and self.kv_heads and self.q_heads != self.kv_heads)


@dataclass
class Skipped:
    """A Softmax (or fused op) that looked like attention but was not taken, and why."""

    name: str
    reason: str
    node: str | None = None  # the Softmax (or op) it is about


@dataclass
class MatchResult:
    sites: list[AttentionSite] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)  # attention-like, not fused (counts as failure)
    ignored: list[Skipped] = field(default_factory=list)  # softmaxes that are not attention-like
    canonical: dict[str, str] = field(default_factory=dict)  # Softmax a canonical rule wrote in the main graph -> rule
    # a multi-head site merged from single-head ones (match/heads_merge.py) -> those sites, to fall back on
    heads_merged: dict[str, list[AttentionSite]] = field(default_factory=dict)
    pieces: dict[str, str] = field(default_factory=dict)  # Softmax whose pieces match/partition.py joined -> how


@dataclass
class SiteOutcome:
    """What a rewrite (fuse, normalize) did to one site: its status, why when it is not the one wanted, and the
    site's max abs error against the original when verified. Each command's report row adds its own columns."""

    site: AttentionSite
    status: SiteStatus = SiteStatus.FUSED
    reason: str = ""
    max_abs_err: float | None = None

    def refuse(self, status: SiteStatus, reason: str) -> None:
        """The site left as it was, and why."""
        self.status, self.reason = status, reason

    def row(self) -> dict:
        """The site as its command's report writes it (JSON): each command has its own columns."""
        raise NotImplementedError(type(self).__name__)
