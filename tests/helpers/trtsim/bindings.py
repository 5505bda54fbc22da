"""Import the real TensorRT Python bindings on a machine without TensorRT's libraries.

`tensorrt_bindings` (the PyPI package tensorrt-cu13-bindings) is the real pybind11 module, but its
`tensorrt.so` links libnvinfer.so.11, libnvonnxparser.so.11 and libnvinfer_plugin.so.11, which only
come with a TensorRT install. We compile tiny stand-ins that define the C entry points the module
imports (each returns NULL and counts calls), load them RTLD_GLOBAL under the right sonames, and
only then import the module: the dynamic loader sees a library with that soname already loaded and
reuses it (LD_LIBRARY_PATH is read once at process start, so it cannot help here).

The module is used for introspection only (classes, enums, docstrings). Nothing in it may be
called: `stub_calls()` returns how often a stub ran, and the tests assert it stays 0.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

MODULE = "tensorrt_bindings"

# What 11.4's tensorrt.so needs from TensorRT (from `nm -D --undefined-only`); used when nm is missing.
FALLBACK_SYMBOLS = (
    "createInferBuilder_INTERNAL",
    "createInferRefitter_INTERNAL",
    "createInferRuntime_INTERNAL",
    "getBuilderPluginRegistry",
    "getPluginRegistry",
    "createNvOnnxParser_INTERNAL",
    "createNvOnnxParserRefitter_INTERNAL",
    "getNvOnnxParserVersion",
    "initLibNvInferPlugins",
)
FALLBACK_LIBRARIES = ("libnvinfer.so.11", "libnvonnxparser.so.11", "libnvinfer_plugin.so.11")

# Set by load_bindings when it returns None: one sentence saying why.
unavailable_reason: str | None = None

_stub_counter: ctypes.CDLL | None = None


def extension_path() -> Path | None:
    """The bindings' compiled module, found without importing the package (importing needs the libs)."""
    spec = importlib.util.find_spec(MODULE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("tensorrt*.so"))
        if found:
            return found[0]
    return None


def needed_libraries(so: Path) -> list[str]:
    """TensorRT sonames the extension depends on (DT_NEEDED), from readelf when available."""
    readelf = shutil.which("readelf")
    if readelf:
        out = subprocess.run([readelf, "-d", str(so)], capture_output=True, text=True).stdout
        libs = re.findall(r"\(NEEDED\)\s+Shared library: \[(libnv[^\]]+)\]", out)
        if libs:
            return libs
    return list(FALLBACK_LIBRARIES)


def missing_symbols(so: Path) -> list[str]:
    """Undefined, unversioned symbols of the extension that only TensorRT provides.

    Versioned ones (foo@GLIBC_2.2.5, @CXXABI) come from the C/C++ runtime; Python's C API and libc's
    dl* functions resolve in this process from elsewhere. What is left resolves nowhere, or from a
    libnv* library (TensorRT's, or our stand-ins once loaded).
    """
    nm = shutil.which("nm")
    if not nm:
        return list(FALLBACK_SYMBOLS)
    out = subprocess.run([nm, "-D", "--undefined-only", str(so)], capture_output=True, text=True)
    if out.returncode != 0:
        return list(FALLBACK_SYMBOLS)
    symbols = []
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) != 2 or parts[0] != "U" or "@" in parts[1]:
            continue
        provider = _provider(parts[1])
        if provider is None or Path(provider).name.startswith("libnv"):
            symbols.append(parts[1])
    return sorted(symbols)


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _provider(symbol: str) -> str | None:
    """The file that provides `symbol` in this process (None when nothing does)."""
    process = ctypes.CDLL(None)
    try:
        address = ctypes.cast(getattr(process, symbol), ctypes.c_void_p)
    except AttributeError:
        return None
    if not hasattr(process, "dladdr"):
        return "?"  # resolvable, provider unknown: not TensorRT's as far as we can tell
    info = _DlInfo()
    if not process.dladdr(address, ctypes.byref(info)) or not info.dli_fname:
        return "?"
    return info.dli_fname.decode(errors="replace")


def _library_for(symbol: str, libraries: list[str]) -> str:
    """Which stub defines a symbol. Resolution is global, so this only keeps the stubs tidy."""
    def pick(stem: str) -> str | None:
        return next((lib for lib in libraries if lib.startswith(stem + ".")), None)

    if "NvOnnxParser" in symbol:
        return pick("libnvonnxparser") or libraries[0]
    if symbol.startswith("initLibNvInferPlugins"):
        return pick("libnvinfer_plugin") or libraries[0]
    return pick("libnvinfer") or libraries[0]


def _stub_source(symbols: list[str], with_counter: bool) -> str:
    lines = ["/* trtsim stand-in: never meant to run; every entry point returns NULL. */"]
    if with_counter:
        lines.append("int trtsim_stub_call_count = 0;")
        lines.append("int trtsim_stub_calls(void) { return trtsim_stub_call_count; }")
    else:
        lines.append("extern int trtsim_stub_call_count;")
    for symbol in symbols:
        lines.append(f"void *{symbol}(void) {{ trtsim_stub_call_count++; return 0; }}")
    return "\n".join(lines) + "\n"


def build_stubs(workdir: Path, libraries: list[str], symbols: list[str]) -> list[Path]:
    """Compile one stub per soname into a cache dir keyed by what goes into it; the counter-owning
    library (libnvinfer) comes first so the others can link against its counter."""
    gcc = shutil.which("gcc")
    if not gcc:
        raise RuntimeError("gcc is not installed")
    libraries = sorted(libraries, key=lambda lib: not lib.startswith("libnvinfer.so"))
    key = hashlib.sha256(repr((libraries, symbols)).encode()).hexdigest()[:12]
    cache = Path(workdir) / f"trt-stubs-{key}"
    cache.mkdir(parents=True, exist_ok=True)
    owner = cache / libraries[0]
    paths = []
    for i, lib in enumerate(libraries):
        path = cache / lib
        paths.append(path)
        if path.exists():
            continue
        mine = [s for s in symbols if _library_for(s, libraries) == lib]
        source = cache / f"{lib}.c"
        source.write_text(_stub_source(mine, with_counter=(i == 0)))
        cmd = [gcc, "-shared", "-fPIC", f"-Wl,-soname,{lib}", "-o", str(path) + ".tmp", str(source)]
        if i:
            cmd += [str(owner)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"gcc failed building {lib}: {result.stderr.strip()}")
        Path(str(path) + ".tmp").rename(path)
    return paths


def _real_libraries_present(libraries: list[str]) -> bool:
    """A real TensorRT install must win: stubs with the same soname would shadow it for the process."""
    if importlib.util.find_spec("tensorrt_libs") is not None:
        return True
    for lib in libraries:
        try:
            ctypes.CDLL(lib)
        except OSError:
            return False
    return True


def load_bindings(workdir) -> object | None:
    """Return the real `tensorrt_bindings` module, loading stub libraries first when needed.

    Returns None (and sets `unavailable_reason`) when the bindings or gcc are missing. Never calls
    a TensorRT function.
    """
    global unavailable_reason, _stub_counter
    unavailable_reason = None
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    so = extension_path()
    if so is None:
        unavailable_reason = (
            "the TensorRT Python bindings are not installed (pip install 'tensorrt-cu13-bindings>=11', "
            "the project's `conformance` extra)"
        )
        return None
    libraries = needed_libraries(so)
    if not _real_libraries_present(libraries):
        if not shutil.which("gcc"):
            unavailable_reason = "gcc is needed to build stand-ins for TensorRT's libraries and is not installed"
            return None
        try:
            paths = build_stubs(Path(workdir), libraries, missing_symbols(so))
        except (RuntimeError, OSError) as error:
            unavailable_reason = f"could not build TensorRT stand-in libraries: {error}"
            return None
        for path in paths:
            handle = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
            if hasattr(handle, "trtsim_stub_calls"):
                _stub_counter = handle
    try:
        return importlib.import_module(MODULE)
    except ImportError as error:
        unavailable_reason = f"importing {MODULE} failed: {error}"
        return None


def stub_calls() -> int | None:
    """How many times a stand-in entry point ran (must stay 0); None when no stubs are loaded."""
    if _stub_counter is None:
        return None
    fn = _stub_counter.trtsim_stub_calls
    fn.restype = ctypes.c_int
    return int(fn())
