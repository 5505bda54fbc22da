"""The verified form and its plan, which both routes to an engine start from: `prepare` (pipeline.py) fuses and
verifies every site, derives the form (forms.py: padded, packed, kv-cache), converts its precision, plans the
lowering and cuts the model for TensorRT's parser, as named steps (STEPS, printed by `describe_steps`);
`describe` prints the plan."""

from .forms import FORMS, derive, form_adapter, verify_form
from .pipeline import (
    STEPS,
    VERIFY_SEEDS,
    Limits,
    Prepared,
    Step,
    all_fused,
    describe,
    describe_steps,
    prepare,
)

__all__ = ["FORMS", "STEPS", "VERIFY_SEEDS", "Limits", "Prepared", "Step", "all_fused",
           "derive", "describe", "describe_steps", "form_adapter", "prepare", "verify_form"]
