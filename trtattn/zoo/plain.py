"""Zoo builders for attention written in plain PyTorch, as model code outside transformers writes it
(issue 10: the users who hit the misses had such code). Short, faithful renditions:

unet_einsum    the transformer block of Stable Diffusion's UNet (ldm/modules/attention.py): heads
               folded into the batch, einsum('b i d, b j d -> b i j') * scale, softmax, einsum back;
               self attention over the 8x8 latent pixels, cross attention to text states
unet_baddbmm   the same block with diffusers' AttnProcessor: torch.baddbmm(empty, q, k^T, beta=0,
               alpha=scale), softmax, torch.bmm
luong_gru      one step of a GRU decoder with Luong's "general" attention (the PyTorch seq2seq
               tutorials): one query position, no scale, masked_fill(-inf) with a mask that is True at
               padding (nn.MultiheadAttention's key_padding_mask convention)
chunked_loop   a streaming encoder that runs its layers chunk by chunk (Emformer-style block
               processing) in a TorchScript-scripted loop over a data-dependent number of chunks:
               the TorchScript exporter writes an ONNX Loop whose body holds the attentions
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .models import BATCH, FLOAT, SEQ, TOKENS, VOCAB, Built, _ids, _randomize, _wrap


# ---------------------------------------------------------------- UNet transformer block
@dataclass
class UNetConfig:
    impl: str = "eager"
    channels: int = 32
    heads: int = 4
    dim_head: int = 8
    context_dim: int = 24
    blocks: int = 2  # each: self attention + cross attention
    size: int = 8  # latent height = width
    context_len: int = 5  # text states


def _heads_to_batch(t: torch.Tensor, heads: int) -> torch.Tensor:
    b, n, d = t.shape  # rearrange(t, 'b n (h d) -> (b h) n d')
    return t.reshape(b, n, heads, d // heads).permute(0, 2, 1, 3).reshape(b * heads, n, d // heads)


def _batch_to_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    bh, n, d = t.shape  # rearrange(t, '(b h) n d -> b n (h d)')
    return t.reshape(bh // heads, heads, n, d).permute(0, 2, 1, 3).reshape(bh // heads, n, heads * d)


class CrossAttention(nn.Module):
    """LDM's CrossAttention (einsum) or diffusers' Attention with AttnProcessor (baddbmm + bmm)."""

    def __init__(self, query_dim: int, context_dim: int, heads: int, dim_head: int, products: str):
        super().__init__()
        inner = heads * dim_head
        self.heads, self.scale, self.products = heads, dim_head ** -0.5, products
        self.to_q = nn.Linear(query_dim, inner, bias=False)
        self.to_k = nn.Linear(context_dim, inner, bias=False)
        self.to_v = nn.Linear(context_dim, inner, bias=False)
        self.to_out = nn.Linear(inner, query_dim)

    def forward(self, x, context=None):
        context = x if context is None else context
        q, k, v = (_heads_to_batch(t, self.heads) for t in (self.to_q(x), self.to_k(context), self.to_v(context)))
        if self.products == "einsum":
            sim = torch.einsum("b i d, b j d -> b i j", q, k) * self.scale
            out = torch.einsum("b i j, b j d -> b i d", sim.softmax(dim=-1), v)
        else:
            empty = torch.empty(q.shape[0], q.shape[1], k.shape[1], dtype=q.dtype, device=q.device)
            scores = torch.baddbmm(empty, q, k.transpose(-1, -2), beta=0, alpha=self.scale)
            out = torch.bmm(scores.softmax(dim=-1), v)
        return self.to_out(_batch_to_heads(out, self.heads))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: UNetConfig, products: str):
        super().__init__()
        dim = cfg.channels
        self.attn1 = CrossAttention(dim, dim, cfg.heads, cfg.dim_head, products)
        self.attn2 = CrossAttention(dim, cfg.context_dim, cfg.heads, cfg.dim_head, products)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x, context):
        x = self.attn1(self.norm1(x)) + x
        x = self.attn2(self.norm2(x), context) + x
        return self.ff(self.norm3(x)) + x


class SpatialTransformer(nn.Module):
    """Latent pixels [B, C, H, W] -> tokens [B, H*W, C] -> blocks -> back, with a residual."""

    def __init__(self, cfg: UNetConfig, products: str):
        super().__init__()
        self.norm = nn.GroupNorm(8, cfg.channels)
        self.proj_in = nn.Conv2d(cfg.channels, cfg.channels, 1)
        self.blocks = nn.ModuleList(TransformerBlock(cfg, products) for _ in range(cfg.blocks))
        self.proj_out = nn.Conv2d(cfg.channels, cfg.channels, 1)

    def forward(self, sample, encoder_hidden_states):
        b, c, h, w = sample.shape
        x = self.proj_in(self.norm(sample)).permute(0, 2, 3, 1).reshape(b, h * w, c)
        for block in self.blocks:
            x = block(x, encoder_hidden_states)
        return self.proj_out(x.reshape(b, h, w, c).permute(0, 3, 1, 2)) + sample


def unet_einsum_config(impl: str) -> UNetConfig:
    return UNetConfig(impl)


unet_baddbmm_config = unet_einsum_config


def _unet(cfg: UNetConfig, products: str) -> Built:
    inputs = {"sample": torch.randn(BATCH, cfg.channels, cfg.size, cfg.size),
              "encoder_hidden_states": torch.randn(BATCH, cfg.context_len, cfg.context_dim)}

    def fn(m, sample, encoder_hidden_states):
        return m(sample, encoder_hidden_states)

    return Built(_wrap(SpatialTransformer(cfg, products), fn, inputs), inputs,
                 {"sample": {0: "batch"}, "encoder_hidden_states": {0: "batch", 1: "seq"}},
                 {"sample": FLOAT, "encoder_hidden_states": FLOAT}, ["out_sample"],
                 {"batch": BATCH, "seq": cfg.context_len}, cfg)


def unet_einsum(cfg: UNetConfig) -> Built:
    return _unet(cfg, "einsum")


def unet_baddbmm(cfg: UNetConfig) -> Built:
    return _unet(cfg, "baddbmm")


# ---------------------------------------------------------------- Luong attention GRU decoder
@dataclass
class LuongConfig:
    impl: str = "eager"
    vocab: int = VOCAB
    hidden: int = 32


class LuongDecoderStep(nn.Module):
    """One decoding step: embed the previous token, advance the GRU, attend over the encoder outputs
    with Luong's general score h_t^T W_a h_s (no scale), combine, project to the vocabulary."""

    def __init__(self, cfg: LuongConfig):
        super().__init__()
        self.embedding = nn.Embedding(cfg.vocab, cfg.hidden)
        self.gru = nn.GRU(cfg.hidden, cfg.hidden, batch_first=True)
        self.attn = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.concat = nn.Linear(2 * cfg.hidden, cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.vocab)

    def forward(self, input_token, last_hidden, encoder_outputs, src_key_padding_mask):
        output, hidden = self.gru(self.embedding(input_token).unsqueeze(1), last_hidden)  # [B, 1, H]
        scores = torch.bmm(output, self.attn(encoder_outputs).transpose(1, 2))  # [B, 1, S]
        scores = scores.masked_fill(src_key_padding_mask.unsqueeze(1), float("-inf"))
        context = torch.bmm(torch.softmax(scores, dim=-1), encoder_outputs)  # [B, 1, H]
        combined = torch.tanh(self.concat(torch.cat([output, context], dim=-1))).squeeze(1)
        return self.out(combined), hidden


def luong_gru_config(impl: str) -> LuongConfig:
    return LuongConfig(impl)


# True where the source is padding: the meaning a plain padding mask has inverted
PADDING_TRUE = {"kind": "padding_mask", "true_at": "padding"}


def luong_gru(cfg: LuongConfig) -> Built:
    mask = torch.zeros(BATCH, SEQ, dtype=torch.bool)
    mask[-1, SEQ - 2:] = True  # the last source is two tokens shorter
    inputs = {"input_token": _ids(BATCH, 1)[:, 0], "last_hidden": torch.randn(1, BATCH, cfg.hidden),
              "encoder_outputs": torch.randn(BATCH, SEQ, cfg.hidden), "src_key_padding_mask": mask}

    def fn(m, **kw):
        return m(**kw)

    return Built(_wrap(LuongDecoderStep(cfg), fn, inputs), inputs,
                 {"input_token": {0: "batch"}, "last_hidden": {1: "batch"}, "encoder_outputs": {0: "batch", 1: "seq"},
                  "src_key_padding_mask": {0: "batch", 1: "seq"}},
                 {"input_token": TOKENS, "last_hidden": FLOAT, "encoder_outputs": FLOAT,
                  "src_key_padding_mask": PADDING_TRUE},
                 ["logits", "hidden"], {"batch": BATCH, "seq": SEQ}, cfg)


# ---------------------------------------------------------------- chunked encoder in a Loop
@dataclass
class ChunkedConfig:
    impl: str = "eager"
    vocab: int = VOCAB
    hidden: int = 32
    heads: int = 4
    layers: int = 2
    chunk: int = 4
    seq: int = 8  # two chunks


class ChunkLayer(nn.Module):
    def __init__(self, cfg: ChunkedConfig):
        super().__init__()
        self.heads = cfg.heads
        self.scale = (cfg.hidden // cfg.heads) ** -0.5
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.norm = nn.LayerNorm(cfg.hidden)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        probs = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * self.scale, dim=-1)
        return x + self.proj(torch.matmul(probs, v).transpose(1, 2).reshape(b, s, d))


class ChunkedEncoder(nn.Module):
    """Block processing: every chunk of `chunk` frames goes through all layers on its own."""

    def __init__(self, cfg: ChunkedConfig):
        super().__init__()
        self.chunk = cfg.chunk
        self.embedding = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(ChunkLayer(cfg) for _ in range(cfg.layers))

    def forward(self, input_ids):
        x = self.embedding(input_ids)
        outs: list[torch.Tensor] = []
        for i in range(x.size(1) // self.chunk):
            h = x[:, i * self.chunk:(i + 1) * self.chunk]
            for layer in self.layers:
                h = layer(h)
            outs.append(h)
        return torch.cat(outs, dim=1)


def chunked_loop_config(impl: str) -> ChunkedConfig:
    return ChunkedConfig(impl)


def chunked_loop(cfg: ChunkedConfig) -> Built:
    inputs = {"input_ids": _ids(BATCH, cfg.seq)}
    # scripted, not traced: tracing would unroll the loop for the example's number of chunks
    module = torch.jit.script(_randomize(ChunkedEncoder(cfg)).eval())
    return Built(module, inputs, {"input_ids": {0: "batch", 1: "seq"}}, {"input_ids": TOKENS}, ["last_hidden_state"],
                 {"batch": BATCH, "seq": cfg.seq}, cfg)
