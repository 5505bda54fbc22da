"""Host memory of this process, as the back ends and the benchmarks report it (Linux /proc, else
getrusage's lifetime peak)."""

from __future__ import annotations

import resource
import sys
from pathlib import Path


def _status_bytes(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def host_rss() -> int | None:
    """Resident set size of this process now, in bytes."""
    return _status_bytes("VmRSS")


def reset_peak_rss() -> bool:
    """Start peak_rss() afresh from the current RSS; False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def peak_rss() -> int | None:
    """Peak resident set size in bytes since the last reset_peak_rss() (else the process's lifetime)."""
    peak = _status_bytes("VmHWM")
    if peak is not None:
        return peak
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib * (1 if sys.platform == "darwin" else 1024)
