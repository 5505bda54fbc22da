"""Verification: the record of one check of a rewrite (or a form, or written ops) against the original, as it
travels from the rewrite to the command line. Made into JSON by `to_json` only (report.py writes the text): the
fields a check did not set are left out, so the report keeps the keys each check has always written."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .graph.user_inputs import InputsUsed


@dataclass
class Verification:
    """One verification's result; `Verification.nothing()` when nothing was verified (its JSON is {})."""

    passed: bool | None = None  # None: not verified (fuse with verify=False)
    note: str | None = None  # why there was nothing to verify ("no attention found")
    iterations: int | None = None
    atol: float | None = None
    rtol: float | None = None
    max_abs_err: float | None = None
    outputs: dict[str, float] | None = None  # graph output -> max abs error
    nan_mismatch: list[str] | None = None
    bounds: dict[str, float] | None = None  # name -> the max abs error allowed
    slices: int | None = None  # the largest model ran in this many slices of layers
    inputs: InputsUsed | None = None  # which inputs it ran on (its JSON: InputsUsed.to_json(), here only)
    lengths: list[dict[str, list[int]]] | None = None  # a ragged form's check: each iteration's per-row lengths
    error: str | None = None  # a check that could not run its inputs, in one line (routes/trt_ops: a kernel's refusal)
    branches: dict[str, Verification] | None = None  # a merged decoder: each If branch's own (rewrite/branches.py)
    note_branches: str | None = None
    tolerance_why: str | None = None  # why atol/rtol are not the model's own
    widened_fp32: Verification | None = None  # a bf16 model fused (rewrite/bf16.py): the check of its widened copy
    run_on: str | None = None  # what ran the candidate when not the model itself (a bf16 model emulated in fp32)
    # output -> (the original's shape, the candidate's) where they differ and cannot be compared
    shapes_differ: dict[str, tuple[list[int], list[int]]] | None = None
    one_key: list[str] | None = None  # sites verified only where their softmax has one key (graph/dims.py): unproven
    empty: bool = dataclasses.field(default=False, repr=False)  # nothing verified, nothing to say

    @classmethod
    def nothing(cls) -> Verification:
        return cls(empty=True)

    @property
    def failed(self) -> bool:
        """Verified and failed (not verified is not a failure)."""
        return self.passed is False

    def headline(self) -> Verification:
        """The verdict and the numbers it was judged at, without the details (a widened check's record)."""
        return Verification(passed=self.passed, max_abs_err=self.max_abs_err, atol=self.atol, rtol=self.rtol)

    def to_json(self) -> dict:
        """The record as reports write it: `passed` always, every other field only when set."""
        if self.empty:
            return {}
        out: dict = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "empty" or (value is None and f.name != "passed"):
                continue
            if isinstance(value, (Verification, InputsUsed)):
                value = value.to_json()
            elif f.name == "branches":
                value = {k: v.to_json() for k, v in value.items()}
            out[f.name] = value
        return out
