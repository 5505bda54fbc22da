"""Zoo builders for transformers families whose attention trtattn misses today (issue 10): real
modelling code, small configs, seeded random weights (models._randomize), no downloads.

gemma2      attention logit soft-capping: cap * tanh(logits / cap) between the scale and the mask
bloom       ALiBi computed in the graph from the padding mask (cumsum x per-head slopes), added by
            torch.baddbmm(alibi, Q, K^T, beta, alpha) on heads merged into [B*N, S, S]
deberta_v2  disentangled attention: content-to-position and position-to-content terms gathered from
            log-bucketed relative positions, bmm on [B*N, S, H], and the probabilities' own sizes read
            back (attention_probs.size(-2)) for the second bmm: a Shape consumer
xlnet       every product an einsum in [S, B, N, H] layout; relative position terms (ac + bd)
fsmt        fairseq-style attention: bmm on heads merged into the batch, in encoder, decoder and cross
wav2vec2    raw 16 kHz audio through seven strided convolutions (receptive field 400 samples, stride
            320): exported as a real export would be, with optimum's dim names and no trtattn hints,
            so the default verification length (8 samples) cannot run; a user passes
            --dims batch_size=2,sequence_length=16000
led         the encoder pads its input to a multiple of the attention window with a padding length
            computed in Python: TorchScript bakes the example's (7 -> 8) into Reshapes, so the export
            runs on lengths 7, 11, 15, ... only, although its dims say "seq"; a user passes seq=7
resnet      no attention at all, saved with external data
"""

from __future__ import annotations

import torch
import transformers as T

from .models import BATCH, FLOAT, VOCAB, Built, _config, _decoder, _encoder, _encoder_decoder, _wrap

SOFTCAP = 5.0  # Gemma 2 ships 50.0; 5.0 keeps the tanh far from linear on these logits, so it matters


def gemma2_config(impl: str):
    return _config(T.Gemma2Config, vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                   max_position_embeddings=64, sliding_window=4, attn_logit_softcapping=SOFTCAP,
                   final_logit_softcapping=None, layer_types=["sliding_attention", "full_attention"],
                   attn_implementation=impl)


def gemma2(cfg) -> Built:
    return _decoder(T.Gemma2Model(cfg), cfg, positions=True)


def bloom_config(impl: str):
    return _config(T.BloomConfig, vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4, attn_implementation=impl)


def bloom(cfg) -> Built:
    return _decoder(T.BloomModel(cfg), cfg)


def deberta_v2_config(impl: str):
    # as deberta-v3: relative attention with log buckets, shared key projections, both terms
    return _config(T.DebertaV2Config, vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                   intermediate_size=64, max_position_embeddings=64, relative_attention=True,
                   position_buckets=8, pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm",
                   share_att_key=True, position_biased_input=False, attn_implementation=impl)


def deberta_v2(cfg) -> Built:
    return _encoder(T.DebertaV2Model(cfg), cfg)


def xlnet_config(impl: str):
    return _config(T.XLNetConfig, vocab_size=VOCAB, d_model=64, n_layer=2, n_head=4, d_inner=64,
                   attn_implementation=impl)


def xlnet(cfg) -> Built:
    return _encoder(T.XLNetModel(cfg), cfg, use_mems=False)


def fsmt_config(impl: str):
    return _config(T.FSMTConfig, langs=["en", "de"], src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=64,
                   encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                   encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, attn_implementation=impl)


def fsmt(cfg) -> Built:
    return _encoder_decoder(T.FSMTModel(cfg), cfg)


AUDIO_SAMPLES = 4000  # the example: a quarter second at 16 kHz, 12 frames after the convolutions


def wav2vec2_config(impl: str):
    # wav2vec2-base's convolution stack (strides 5,2,2,2,2,2,2; kernels 10,3,3,3,3,2,2) with narrow channels
    return _config(T.Wav2Vec2Config, vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                   intermediate_size=64, conv_dim=(32,) * 7, num_conv_pos_embeddings=16,
                   num_conv_pos_embedding_groups=4, attn_implementation=impl)


def wav2vec2(cfg) -> Built:
    inputs = {"input_values": torch.randn(BATCH, AUDIO_SAMPLES)}

    def fn(m, input_values):
        return m(input_values=input_values).last_hidden_state

    # optimum's names for these axes; a real export carries no hint of what length fits
    return Built(_wrap(T.Wav2Vec2Model(cfg), fn, inputs), inputs, {"input_values": {0: "batch_size", 1: "sequence_length"}},
                 {"input_values": FLOAT}, ["last_hidden_state"], {"batch_size": BATCH, "sequence_length": AUDIO_SAMPLES},
                 cfg)



def led_config(impl: str):
    return _config(T.LEDConfig, vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2,
                   encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                   attention_window=4, max_encoder_position_embeddings=64, max_decoder_position_embeddings=64,
                   attn_implementation=impl)


def led(cfg) -> Built:
    return _encoder_decoder(T.LEDModel(cfg), cfg)


def resnet_config(impl: str):
    return T.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic")


def resnet(cfg) -> Built:
    """No attention at all: with external data, the case where `fuse` has nothing to rewrite and must
    still write a complete model (issue 10, outputs)."""
    from .models import _image_model

    return _image_model(T.ResNetModel(cfg), cfg, 32)
