"""The inputs verification feeds, by their three homes: roles.py (what each input means), dim_names.py
(every symbolic dim gets a value) and feeds.py (the feed dicts). Import from those; these names stay
importable here for code written against the one module this was."""

from .dim_names import (
                        BATCH,
                        DEFAULT_DIM,
                        DEFAULT_DIMS,
                        SEQ,
                        dim_classes,
                        dim_value,
                        evaluate,
                        is_free,
                        name_free_dims,
                        resolve_dims,
)
from .feeds import make_feeds
from .roles import GraphUses, InputSpec, declared_dims, input_specs, kept_tokens

__all__ = ["BATCH", "DEFAULT_DIM", "DEFAULT_DIMS", "SEQ", "dim_classes", "dim_value", "evaluate", "is_free",
           "name_free_dims", "resolve_dims", "make_feeds", "GraphUses", "InputSpec", "declared_dims", "input_specs",
           "kept_tokens"]
