"""The --dims option: symbolic dim values a user gives."""

from __future__ import annotations

from ..errors import TrtattnError


def parse_dims(text: str | None) -> dict[str, int]:
    """'batch=2,seq=16' -> {'batch': 2, 'seq': 16}."""
    out = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise TrtattnError(f"bad --dims entry '{part}': expected name=value")
        k, v = part.split("=", 1)
        try:
            out[k.strip()] = int(v)
        except ValueError:
            raise TrtattnError(f"bad --dims entry '{part}': {v!r} is not an integer") from None
        if out[k.strip()] < 0:
            raise TrtattnError(f"bad --dims entry '{part}': a dim is at least 0 (0: an empty past)")
    return out
