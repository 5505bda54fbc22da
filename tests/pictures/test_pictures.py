"""The HTML report (pictures of every site, drawn by Graphviz, checked in a real browser) and the progress
shown on long work (bars on a terminal, plain lines elsewhere, nothing with --quiet)."""

import io
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import onnx
import pytest

from trtattn.report import Progress
from trtattn.testing.graphs import attention_model, two_attentions

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed (apt-get install "
                                                                   "graphviz; .ci/run installs it)")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_browser = pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install chromium; .ci/run installs it)")
BROWSER_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def cli(*args, tty=False, env=None):
    """The command as a user runs it; with tty=True its stderr is a pseudo-terminal (as in a shell)."""
    command = [sys.executable, "-m", "trtattn", *map(str, args)]
    if not tty:
        return subprocess.run(command, capture_output=True, text=True, env=env)
    import fcntl
    import pty
    import termios

    leader, follower = pty.openpty()
    # a terminal 200 columns wide: a new pty is 0 x 0, where tqdm draws its bars cut to nothing
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=follower, text=True, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the other end closed
            break
        if not data:
            break
        chunks.append(data)
    out = proc.stdout.read()
    proc.wait()
    os.close(leader)
    return subprocess.CompletedProcess(command, proc.returncode, out, b"".join(chunks).decode(errors="replace"))


def browser(page: Path, tmp_path: Path, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *BROWSER_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}", *extra,
                           page.resolve().as_uri()], capture_output=True, text=True, timeout=120)


def png_colours(path: Path) -> int:
    """How many distinct byte values the PNG's pixel rows hold (a blank page has one or two)."""
    data, idat, pos = path.read_bytes(), b"", 8
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    return len(set(zlib.decompress(idat)))


# ---------------------------------------------------------------- the pictures
@needs_dot
def test_fused_sites_are_drawn_with_roles_and_replacement(tmp_path):
    from trtattn.pictures import fuse_entry, render
    from trtattn.rewrite.fuse import fuse_model

    model = two_attentions()
    result = fuse_model(model)
    assert result.ok and len(result.reports) == 2
    entry = fuse_entry("two", model, result)
    page = render([entry])
    sections = re.findall(r'<section class="site" data-site="([^"]+)" data-status="([^"]+)">(.*?)</section>', page, re.S)
    assert [(n, s) for n, s, _ in sections] == [(r.site.name, "fused") for r in result.reports]
    for _, _, body in sections:
        assert body.count("<svg") == 2  # as exported, and what replaced it
        for role in ("[softmax]", "[Q·Kᵀ]", "[P·V]", "[fused attention]"):
            assert role in body
        assert "[scale]" in body  # attention_model divides the logits by sqrt(head)


@needs_dot
def test_a_site_not_fused_is_drawn_around_its_softmax_with_the_reason(tmp_path):
    from trtattn.pictures import fuse_entry, render
    from trtattn.rewrite.fuse import fuse_model

    model = attention_model(qdq="logits")  # logits quantized inside the attention: no fused op computes that
    result = fuse_model(model)
    assert [r.status for r in result.reports] == ["not fused"]
    entry = fuse_entry("qdq", model, result)
    page = render([entry])
    assert "where the match stopped" in page and "what replaced it" not in page
    assert "quantized inside the attention" in page  # the reason, shown
    softmax = result.reports[0].site.softmax
    drawn = re.search(rf'<g id="node:{re.escape(softmax)}".*?</g>', page, re.S)
    assert drawn and "#dc3545" in drawn.group(0)  # the node that stopped the match, highlighted


def test_progress_bars_on_a_terminal_and_plain_lines_elsewhere():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    tty, plain, quiet = Terminal(), io.StringIO(), io.StringIO()
    for stream, enabled in ((tty, True), (plain, True), (quiet, False)):
        p = Progress(enabled=enabled, stream=stream)
        with p.step("verifying"):
            assert sum(p.track(range(5), "slices", unit="slice")) == 10
    assert "\r" in tty.getvalue() and re.search(r"\d+/5 \[.*<", tty.getvalue())  # a bar: count, elapsed<ETA
    assert "[trtattn] verifying done" in tty.getvalue()
    assert "\r" not in plain.getvalue()
    lines = plain.getvalue().splitlines()
    assert lines == ["[trtattn] verifying ...", "[trtattn] slices (5 slice) ...",
                     lines[2], lines[3]] and lines[2].startswith("[trtattn] slices: 5 done (")
    assert lines[3].startswith("[trtattn] verifying done (")
    assert quiet.getvalue() == ""


# ---------------------------------------------------------------- the command, in a real browser and terminal
@needs_dot
def test_fuse_report_html_refuses_an_existing_page_and_writes_one(tmp_path):
    model, out, page = tmp_path / "m.onnx", tmp_path / "f.onnx", tmp_path / "r.html"
    onnx.save(two_attentions(), str(model))
    page.write_text("keep me")
    refused = cli("fuse", model, "-o", out, "--report-html", page)
    assert refused.returncode == 2 and "exists" in refused.stderr and page.read_text() == "keep me"
    assert not out.exists()
    page.unlink()
    done = cli("fuse", model, "-o", out, "--report-html", page)
    assert done.returncode == 0, done.stderr
    assert page.read_text().count('<section class="site"') == 2


@pytest.mark.slow
@needs_dot
@needs_browser
def test_report_renders_every_site_in_a_real_browser(tmp_path, zoo_export):
    model = zoo_export("bart", "torchscript")
    out, page, shot = tmp_path / "f.onnx", tmp_path / "r.html", tmp_path / "r.png"
    done = cli("fuse", model, "-o", out, "--report-html", page)
    assert done.returncode == 0, done.stderr
    sites = page.read_text().count('<section class="site"')
    assert sites == 6  # BART: encoder self, decoder self and cross, two layers each
    dom = browser(page, tmp_path, "--dump-dom").stdout
    assert f'data-sites-drawn="{sites}"' in dom  # the page's script measured a laid-out picture in every site
    assert dom.count('data-drawn="yes"') == sites
    browser(page, tmp_path, "--window-size=1400,1600", f"--screenshot={shot}")
    assert shot.exists() and png_colours(shot) > 50  # a drawn page, not a blank one


def test_progress_on_a_terminal_and_not_in_a_pipe_nor_with_quiet(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(attention_model(), str(model))
    on_tty = cli("fuse", model, "-o", tmp_path / "a.onnx", tty=True)
    assert on_tty.returncode == 0, on_tty.stderr
    assert "\r" in on_tty.stderr and "[trtattn]" in on_tty.stderr
    # a step's live timer drawn (not only the pty's \r\n line endings)
    assert re.search(r"\r\[trtattn\] verifying against the original[^\r\n]* \d\d:\d\d", on_tty.stderr), on_tty.stderr
    piped = cli("fuse", model, "-o", tmp_path / "b.onnx")
    assert piped.returncode == 0 and "\r" not in piped.stderr and "[trtattn] verifying" in piped.stderr
    quiet = cli("--quiet", "fuse", model, "-o", tmp_path / "c.onnx", tty=True)
    assert quiet.returncode == 0 and quiet.stderr.strip() == ""


def _long_work_model(path: Path) -> Path:
    """A masked attention whose length is baked into a Reshape (the default dims fail: the dims search runs),
    its weights in a data file (the output is written with one)."""
    from onnx import helper, numpy_helper

    m = attention_model(mask_style="causal_trilu")
    m.graph.node.insert(0, helper.make_node("Reshape", ["x", "target"], ["x_fixed"], name="needs_seq_12"))
    for n in m.graph.node[1:]:
        n.input[:] = ["x_fixed" if i == "x" else i for i in n.input]
    m.graph.initializer.append(numpy_helper.from_array(np.array([-1, 12, 32], np.int64), "target"))
    del m.metadata_props[:]  # no declared dims: they are searched
    onnx.save(m, str(path), save_as_external_data=True, location=path.name + ".data", size_threshold=0)
    return path


COUNTED = ("searching dims the model runs on", "probing the masks of 1 sites", "running the original model in slices",
           "running the rewritten model in slices", "writing {output}.data")


def test_counted_bars_for_the_dims_search_mask_probes_slices_and_writing_on_a_terminal_only(tmp_path):
    """On a terminal each long loop inside a step draws a bar with its count (n/total); piped, the lines are
    the steps' own as before (no bar, no count line), and --quiet prints nothing."""
    model = _long_work_model(tmp_path / "m.onnx")
    env = {**os.environ, "TRTATTN_SLICE_MB": "1"}  # verification runs each model in slices of layers
    on_tty = cli("fuse", model, "-o", tmp_path / "o1.onnx", tty=True, env=env)
    assert on_tty.returncode == 0, on_tty.stderr
    for text in COUNTED:
        text = re.escape(text.format(output="o1.onnx"))
        assert re.search(rf"\[trtattn\] {text}[^\n\r]*: [^\n\r]*\d+/\d+ \[", on_tty.stderr), (text, on_tty.stderr)
    piped = cli("fuse", model, "-o", tmp_path / "o1.onnx", env=env)  # same output name: the same data file name
    assert piped.returncode == 2 and "exists" in piped.stderr  # nothing overwritten
    piped = cli("fuse", model, "-o", tmp_path / "o2.onnx", env=env)
    assert piped.returncode == 0 and "\r" not in piped.stderr, piped.stderr
    assert not any(text.format(output="o2.onnx") in piped.stderr for text in COUNTED), piped.stderr
    assert "[trtattn] verifying against the original" in piped.stderr and "[trtattn] dims: seq=12" in piped.stderr
    quiet = cli("--quiet", "fuse", model, "-o", tmp_path / "o3.onnx", tty=True, env=env)
    assert quiet.returncode == 0 and quiet.stderr.strip() == ""
