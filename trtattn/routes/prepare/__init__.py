"""The verified form and its plan, which both routes to an engine start from: `prepare` (pipeline.py) fuses and
verifies every site, derives the form (forms.py: padded, packed, kv-cache), converts its precision, plans the
lowering and cuts the model for TensorRT's parser; `describe` prints the plan."""

from .forms import FORMS, derive, form_adapter, verify_form
from .pipeline import PRECISIONS, QUANTIZED, VERIFY_SEEDS, Limits, Prepared, all_fused, describe, prepare

__all__ = ["FORMS", "PRECISIONS", "QUANTIZED", "VERIFY_SEEDS", "Limits", "Prepared", "all_fused", "derive",
           "describe", "form_adapter", "prepare", "verify_form"]
