"""Mutation testing of the lines a change touches, with cosmic-ray (PyPI), each mutant against the fast-lane tests
that execute its line. README: "Mutation testing".

    python benchmarks/mutate.py --base origin/main                        # every trtattn/ line changed since base
    python benchmarks/mutate.py --base origin/main --sample 40 --seed 1   # 40 of those lines at random, one mutant each
    python benchmarks/mutate.py trtattn/match/find.py:115-125 trtattn/graph/roles.py
    python benchmarks/mutate.py --base d3efd07 --count                    # only count the lines and mutants

1. The lines: those added or changed since --base in trtattn/ (the product and the tests' helpers in
   trtattn/testing and trtattn/zoo), or the modules (and line spans) given, or both (their changed lines).
2. Which test executes which line: one run of the fast lane (-m "not slow") under coverage.py with each test
   as its context (pytest-cov's --cov-context=test), in a copy of the tree. The run is the costly part: its
   database is kept as out/mutate/coverage-KEY.sqlite (KEY: the commit, and a hash of uncommitted changes)
   with the zoo exports it made, and reused while the tree is the same (--coverage DB: a given database).
3. The mutants: cosmic-ray's operators on those lines, except swaps that only make noise here (bit
   operations, floor division, modulo, power, `is`). --sample N: N lines at random (--seed), one of each
   line's mutants at random; else every mutant of every line.
4. Each mutant is applied in the copy (cosmic-ray mutate-and-test; the checkout is never touched) and the
   tests that execute its line run with -x: killed when they fail. A line only its module's import runs (a
   constant, a default) is run against every test that executes the module. A line no test executes is a
   survivor, "not covered", without a run. The tests reuse the coverage run's zoo exports, except for
   mutants of trtattn/zoo/ (the exporter itself), which export afresh.

Prints each module's kill rate and every surviving mutant (file:line, operator, the mutated line, the tests it
ran against) and exits 1 if any survived: each survivor gets a test, or a reason in the issue's closing note.
cosmic-ray runs from its own venv (--cosmic-ray, default: on PATH, else .venv-mut/bin beside this checkout or
beside the venv running this); the tests run with this interpreter (--python), which needs pytest-cov and
pytest-xdist (the `dev` extra).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import random
import re
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "out" / "mutate"
COPIED = ("trtattn", "plugins", "tests", "benchmarks", "pyproject.toml")
EXCLUDED_OPERATORS = [  # swaps that only make noise here: bit operations, floor division, modulo, power
    r"core/ReplaceBinaryOperator_.*_(RShift|LShift|BitOr|BitAnd|BitXor|FloorDiv|Mod|Pow)$",
    r"core/ReplaceBinaryOperator_(RShift|LShift|BitOr|BitAnd|BitXor|FloorDiv|Mod|Pow)_.*",
    r"core/ReplaceComparisonOperator_.*_(Is|IsNot)$", r"core/ReplaceComparisonOperator_(Is|IsNot)_.*",
]


# ---------------------------------------------------------------- which lines
def changed_lines(base: str) -> dict[str, list[str]]:
    """{trtattn module: ["start-end", ...]} of the lines added or changed since `base` (git diff -U0)."""
    diff = _git("diff", "-U0", base, "--", "trtattn")
    lines: dict[str, list[str]] = {}
    path = None
    for line in diff.splitlines():
        if line.startswith("+++ "):
            path = line[6:] if line.startswith("+++ b/") and line.endswith(".py") else None
        elif path and (m := re.match(r"@@ -\S+ \+(\d+)(?:,(\d+))? @@", line)):
            start, count = int(m.group(1)), int(m.group(2) or 1)
            if count:
                lines.setdefault(path, []).append(f"{start}-{start + count - 1}")
    return lines


def given_lines(specs: list[str]) -> dict[str, list[str]]:
    """"path" (the whole module) or "path:10-20" / "path:15"."""
    lines: dict[str, list[str]] = {}
    for spec in specs:
        path, _, span = spec.partition(":")
        if not (ROOT / path).is_file():
            raise SystemExit(f"mutate: no such module {path}")
        lines.setdefault(path, []).append(span or f"1-{len((ROOT / path).read_text().splitlines())}")
    return lines


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


# ---------------------------------------------------------------- which tests execute which line
def tree_key() -> str:
    """The commit, and a hash of what differs from it in the copied paths (tracked changes, untracked files)."""
    commit = _git("rev-parse", "HEAD").strip()[:12]
    untracked = _git("ls-files", "--others", "--exclude-standard", "--", *COPIED).split()
    dirty = _git("diff", "HEAD", "--", *COPIED) + "".join(f"{n}\n{(ROOT / n).read_text(errors='replace')}"
                                                         for n in untracked if (ROOT / n).is_file())
    return commit + (f"-{hashlib.sha256(dirty.encode()).hexdigest()[:8]}" if dirty else "")


def coverage_run(work: Path, db: Path, zoo: Path, args) -> None:
    """The fast lane under coverage in the copy at `work`, each test its own context, into `db`."""
    rc = work / ".coveragerc-mutate"
    rc.write_text("[run]\nrelative_files = True\n")
    jobs = ["-n", str(args.jobs), "--dist", "loadfile"] if args.jobs > 1 else []
    argv = [args.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *jobs, "--cov=trtattn",
            "--cov-context=test", f"--cov-config={rc}", "--cov-report="]
    print(f"mutate: which test executes which line: the fast lane under coverage ({db.name}) ...", flush=True)
    env = _env(work, zoo) | {"COVERAGE_FILE": str(db)}
    start, cpu = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True)
    if done.returncode:
        db.unlink(missing_ok=True)
        raise SystemExit(f"mutate: the fast lane fails unmutated:\n{done.stdout[-3000:]}")
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime
    print(f"mutate: coverage run {time.monotonic() - start:.0f} s, {seconds:.0f} s CPU: "
          f"{done.stdout.strip().splitlines()[-1]}", flush=True)


class Coverage:
    """The tests (pytest node ids) that execute each line, from a coverage database with test contexts."""

    def __init__(self, db: Path):
        from coverage import CoverageData

        self.data = CoverageData(basename=str(db))
        self.data.read()
        self.files = set(self.data.measured_files())

    def tests(self, module: str, line: int) -> list[str]:
        if module not in self.files:
            return []
        by_line = self.data.contexts_by_lineno(module)
        if line in import_time_lines(ROOT / module):  # a constant, a default, a decorator: every user of the module
            contexts = {c for cs in by_line.values() for c in cs}
        else:
            contexts = set(by_line.get(line, ()))
        return sorted({c.rsplit("|", 1)[0] for c in contexts if c})


def import_time_lines(path: Path) -> set[int]:
    """The lines outside every function body: run when the module is imported, by whichever test imports it
    first (or by none, at collection), while what they define serves every test that uses the module."""
    tree = ast.parse(path.read_text())
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inside.update(range(node.body[0].lineno, (node.end_lineno or node.lineno) + 1))
    return set(range(1, len(path.read_text().splitlines()) + 1)) - inside


# ---------------------------------------------------------------- mutants
def cosmic_ray(explicit: str | None) -> Path:
    # .venv-mut beside this checkout, else beside the venv running us (a git worktree shares the main one's)
    beside = [root / ".venv-mut" / "bin" / "cosmic-ray" for root in (ROOT, Path(sys.executable).parent.parent.parent)]
    for candidate in (explicit, shutil.which("cosmic-ray"), *map(str, beside)):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise SystemExit("mutate: cosmic-ray not found: python3 -m venv .venv-mut && "
                     ".venv-mut/bin/pip install 'cosmic-ray>=8.7' (or pass --cosmic-ray PATH)")


def mutants(module: str, spans: list[str], cr: Path, work: Path) -> list[dict]:
    """cosmic-ray's mutants of `module` on `spans` (its operators, less EXCLUDED_OPERATORS), in line order."""
    name = re.sub(r"\W", "_", module)
    config, session = work / f"{name}.toml", work / f"{name}.sqlite"
    config.write_text("\n".join([
        "[cosmic-ray]", f'module-path = "{module}"', "timeout = 1", "excluded-modules = []", 'test-command = "true"',
        "[cosmic-ray.distributor]", 'name = "local"',
        "[cosmic-ray.filters.operators-filter]", f"exclude-operators = {json.dumps(EXCLUDED_OPERATORS)}",
        "[cosmic-ray.filters.line-filter]", f"lines = {{ {json.dumps(module)} = {json.dumps(spans)} }}", ""]))
    for cmd in ([cr, "init", config, session], [cr.parent / "cr-filter-operators", session, config],
                [cr.parent / "cr-filter-lines", "--config", config, session]):
        subprocess.run([str(c) for c in cmd], cwd=work, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dump = subprocess.run([str(cr), "dump", str(session)], cwd=work, check=True, capture_output=True, text=True).stdout
    source = (work / module).read_text().splitlines()
    found = []
    for line in dump.splitlines():
        job, result = json.loads(line)
        if result is None:  # pending: not filtered out
            m = job["mutations"][0]
            found.append({"module": module, "line": m["start_pos"][0], "operator": m["operator_name"],
                          "occurrence": m["occurrence"], "source": source[m["start_pos"][0] - 1].strip()})
    return sorted(found, key=lambda m: (m["line"], m["operator"], m["occurrence"]))


def sample(found: list[dict], n: int | None, seed: int) -> list[dict]:
    """n lines at random, one mutant of each at random (the same for the same seed and code); all without n."""
    if n is None:
        return found
    by_line: dict[tuple[str, int], list[dict]] = {}
    for m in found:
        by_line.setdefault((m["module"], m["line"]), []).append(m)
    rng = random.Random(seed)
    lines = sorted(rng.sample(sorted(by_line), min(n, len(by_line))))
    return [rng.choice(by_line[line]) for line in lines]


def run_mutant(mutant: dict, tests: list[str], cr: Path, work: Path, zoo: Path | None, args) -> dict:
    """Apply `mutant` in the copy, run `tests` -x (a timeout kills), put the module back: its outcome and diff."""
    argv = ["timeout", "-k", "10", str(args.timeout), args.python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
            *tests]
    fresh = mutant["module"].startswith("trtattn/zoo/")  # the exporter mutated: its exports are made afresh
    env = _env(work, None if fresh else zoo)
    done = subprocess.run([str(cr), "mutate-and-test", mutant["module"], mutant["operator"], str(mutant["occurrence"]),
                           shlex.join(argv)], cwd=work, env=env, capture_output=True, text=True)
    try:
        result = json.loads(done.stdout)
    except ValueError:
        raise SystemExit(f"mutate: cosmic-ray failed on {mutant}:\n{done.stderr[-2000:]}") from None
    outcome = result.get("test_outcome") or result.get("worker_outcome")
    return {**mutant, "outcome": outcome, "tests": len(tests), "diff": result.get("diff") or ""}


def _env(work: Path, zoo: Path | None) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{work}{os.pathsep}{work / 'plugins'}", "OMP_NUM_THREADS": "1"}
    env.pop("TRTATTN_ZOO_CACHE", None)
    return env | ({"TRTATTN_ZOO_CACHE": str(zoo)} if zoo else {})


def _files(tests: list[str]) -> str:
    """: the test files and how many of their tests, the most first (four at most)."""
    counts: dict[str, int] = {}
    for t in tests:
        counts[t.split("::")[0]] = counts.get(t.split("::")[0], 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    # by the path under tests/: the folders mirror trtattn's packages, so two files may share a name
    shown = ", ".join(f"{f.removeprefix('tests/')} {n}" for f, n in ranked[:4])
    return f": {shown}" + (f", {len(ranked) - 4} more files" if len(ranked) > 4 else "") if ranked else ""


def mutated_line(diff: str) -> str:
    return next((line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")),
                "")


def _scratch(folder: str, names: list[str]) -> set[str]:
    """What the copy of the tree leaves out: caches, and models and weights made by runs (not the corpus
    committed under tests/data, which tests read)."""
    made = shutil.ignore_patterns("*.onnx", "*.data")(folder, names)
    keep = "tests/data" in Path(folder).as_posix()
    return shutil.ignore_patterns("__pycache__")(folder, names) | (set() if keep else made)


# ---------------------------------------------------------------- the run
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("modules", nargs="*", help="path[:start-end] of modules to mutate (default: --base's changes)")
    p.add_argument("--base", help="git revision: mutate the trtattn/ lines changed since it (of the modules given)")
    p.add_argument("--sample", type=int, help="mutate N lines drawn at random, one mutant each")
    p.add_argument("--seed", type=int, default=0, help="the sample's seed")
    p.add_argument("--tests", nargs="+", help="pytest arguments for every mutant instead of the tests executing its line")
    p.add_argument("--coverage", type=Path, help="a coverage database with test contexts (default: made, or reused)")
    p.add_argument("--jobs", type=int, default=2, help="pytest-xdist workers of the coverage run (1: none)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per mutant's test run (past it: killed)")
    p.add_argument("--python", default=sys.executable, help="the interpreter that runs the tests")
    p.add_argument("--cosmic-ray", help="the cosmic-ray executable (its cr-* tools beside it)")
    p.add_argument("--count", action="store_true", help="only count the lines and mutants (no test runs)")
    p.add_argument("--json", help="write every mutant's outcome here")
    args = p.parse_args(argv)
    if not (args.modules or args.base):
        p.error("give modules, --base, or both (the changed lines of those modules)")
    lines = given_lines(args.modules) if args.modules else {}
    if args.base:  # with modules: only their changed lines
        changed = changed_lines(args.base)
        lines = {m: changed[m] for m in lines if m in changed} if args.modules else changed
    if not lines:
        print("mutate: no trtattn/ lines changed")
        return 0
    cr = cosmic_ray(args.cosmic_ray)
    key = tree_key()
    db, zoo = args.coverage or CACHE / f"coverage-{key}.sqlite", CACHE / f"zoo-{key}"
    if args.tests or (args.coverage and not zoo.is_dir()):  # no coverage run of ours: the user's exports, if any
        zoo = Path(os.environ["TRTATTN_ZOO_CACHE"]) if os.environ.get("TRTATTN_ZOO_CACHE") else None
    with tempfile.TemporaryDirectory(prefix="trtattn-mutate-") as tmp:
        work = Path(tmp)
        for item in COPIED:
            src = ROOT / item
            (shutil.copytree(src, work / item, ignore=_scratch) if src.is_dir() else shutil.copy2(src, work / item))
        found = [m for module, spans in sorted(lines.items()) for m in mutants(module, spans, cr, work)]
        chosen = sample(found, args.sample, args.seed)
        print(f"mutate: {len(found)} mutants on {len({(m['module'], m['line']) for m in found})} lines of "
              f"{len(lines)} modules; {len(chosen)} to run", flush=True)
        if args.count:
            return 0
        if args.tests is None and not db.exists():
            db.parent.mkdir(parents=True, exist_ok=True)
            assert zoo is not None
            zoo.mkdir(parents=True, exist_ok=True)
            coverage_run(work, db.resolve(), zoo, args)
        covered = Coverage(db) if args.tests is None else None
        results = []
        for i, mutant in enumerate(chosen, 1):
            tests = args.tests or (covered.tests(mutant["module"], mutant["line"]) if covered else [])
            if not tests:
                result = {**mutant, "outcome": "not covered", "tests": 0, "diff": ""}
            else:
                result = run_mutant(mutant, tests, cr, work, zoo, args)
            where = f"{mutant['module']}:{mutant['line']} {mutant['operator']}"
            print(f"  [{i}/{len(chosen)}] {where}: {result['outcome']} ({result['tests']} tests{_files(tests)})",
                  flush=True)
            results.append(result)
    for module in sorted({r["module"] for r in results}):
        mine = [r for r in results if r["module"] == module]
        killed = sum(r["outcome"] == "killed" for r in mine)
        print(f"{module}: {killed}/{len(mine)} killed")
    survivors = [r for r in results if r["outcome"] != "killed"]
    for r in survivors:
        print(f"SURVIVED {r['module']}:{r['line']} {r['operator']} ({r['outcome']}, {r['tests']} tests): "
              f"{mutated_line(r['diff']) or r['source']}")
    total = len(results)
    print(f"kill rate: {total - len(survivors)}/{total}" + (f" = {(total - len(survivors)) / total:.0%}" if total else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
