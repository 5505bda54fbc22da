"""site_names: every name trtattn writes for a site is read back by the same module."""

from trtattn.site_names import (
    engine_layer,
    engine_layer_sites,
    layer_metadata,
    metadata_sites,
    names_site,
    site_scope,
)


def test_a_rewrites_names_are_blamed_on_their_site_and_not_on_one_named_like_its_prefix():
    error = f"[ONNXRuntimeError] running Add node. Name:'{site_scope('l0.attn', 'mask', 'add')}'"
    assert names_site(error, "l0.attn")
    assert not names_site(error, "l0")  # a site whose name is a prefix of another's is not blamed for it
    assert not names_site(error, "l0.att")


def test_engine_layer_names_and_metadata_read_back_as_their_site():
    layer = engine_layer("model/layers.0/self_attn")
    info = f"{{ForeignNode[{layer}/q_scale...{layer}]}} | {layer_metadata('model/layers.0/self_attn', 'Attention_0')}"
    assert engine_layer_sites(info) == ["model/layers.0/self_attn/q_scale...trtattn/attn/model/layers.0/self_attn"]
    assert engine_layer_sites(info.replace("...", " ")) == ["model/layers.0/self_attn/q_scale", "model/layers.0/self_attn"]
    assert metadata_sites(info) == ["model/layers.0/self_attn"]
