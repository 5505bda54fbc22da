"""Mutation testing of the lines a change touches, with cosmic-ray (PyPI), against the fast-lane tests that cover
each module. README: "Mutation testing".

    python benchmarks/mutate.py --base origin/main                      # every trtattn/ line changed since base
    python benchmarks/mutate.py trtattn/match/logit_ops/softcap.py trtattn/match/find.py:115-125
    python benchmarks/mutate.py --base d3efd07 trtattn/folder.py --count    # its changed lines; only count them

Each module is mutated in a copy of the tree (the checkout is never touched), one cosmic-ray session per module,
restricted to the changed (or given) lines and to the operators that make sense for this code (no bit-shift or
modulo swaps). Tests per module: [tool.trtattn.mutation.tests] in pyproject.toml, else the test files that import
the module, always with -m "not slow" -x. Prints each module's kill rate and every surviving mutant (file:line,
operator, the mutated line): each survivor gets a test, or a reason in the issue's closing note.
cosmic-ray runs from its own venv (--cosmic-ray, default: on PATH, else .venv-mut/bin): it needs none of
trtattn's dependencies; the tests run with this interpreter (--python).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("trtattn", "plugins", "tests", "benchmarks", "pyproject.toml")
EXCLUDED_OPERATORS = [  # swaps that only make noise here: bit operations, floor division, modulo, power
    r"core/ReplaceBinaryOperator_.*_(RShift|LShift|BitOr|BitAnd|BitXor|FloorDiv|Mod|Pow)$",
    r"core/ReplaceBinaryOperator_(RShift|LShift|BitOr|BitAnd|BitXor|FloorDiv|Mod|Pow)_.*",
    r"core/ReplaceComparisonOperator_.*_(Is|IsNot)$", r"core/ReplaceComparisonOperator_(Is|IsNot)_.*",
]


def changed_lines(base: str) -> dict[str, list[str]]:
    """{trtattn module: ["start-end", ...]} of the lines added or changed since `base` (git diff -U0)."""
    diff = subprocess.run(["git", "diff", "-U0", base, "--", "trtattn"], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout
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


def tests_for(module: str) -> list[str]:
    """The pytest arguments that cover `module`: pyproject's map, else the test files importing it."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapped = config.get("tool", {}).get("trtattn", {}).get("mutation", {}).get("tests", {})
    if module in mapped:
        return list(mapped[module])
    dotted = module.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    package, _, name = dotted.rpartition(".")
    pattern = re.compile(rf"\b{re.escape(dotted)}\b|from {re.escape(package)} import .*\b{re.escape(name)}\b")
    found = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py") if pattern.search(p.read_text()))
    if not found:
        raise SystemExit(f"mutate: no test imports {dotted}; map it in pyproject.toml [tool.trtattn.mutation.tests]")
    return found


def cosmic_ray(explicit: str | None) -> Path:
    # .venv-mut beside this checkout, else beside the venv running us (a git worktree shares the main one's)
    beside = [root / ".venv-mut" / "bin" / "cosmic-ray" for root in (ROOT, Path(sys.executable).parent.parent.parent)]
    for candidate in (explicit, shutil.which("cosmic-ray"), *map(str, beside)):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise SystemExit("mutate: cosmic-ray not found: python3 -m venv .venv-mut && "
                     ".venv-mut/bin/pip install 'cosmic-ray>=8.7' (or pass --cosmic-ray PATH)")


# Keeps a seeded sample of N pending mutants (the same N for the same seed and code), the others marked skipped
# (cosmic-ray's own WorkDB API, as its filters do); runs in cosmic-ray's venv.
SAMPLE = """
import random, sys
from cosmic_ray.work_db import use_db, WorkDB
from cosmic_ray.work_item import WorkResult, WorkerOutcome
session, keep, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with use_db(session, WorkDB.Mode.open) as db:
    where = lambda item: [(m.start_pos, m.operator_name, m.occurrence) for m in item.mutations]
    pending = [item.job_id for item in sorted(db.pending_work_items, key=where)]  # job ids are random uuids
    kept = set(random.Random(seed).sample(pending, min(keep, len(pending))))
    dropped = [job for job in pending if job not in kept]
    if dropped:
        db.set_multiple_results(dropped, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
"""


def run_module(module: str, spans: list[str], tests: list[str], args, work: Path) -> list[dict]:
    """One cosmic-ray session over `module`'s `spans` in the copy at `work`: its results, one dict a mutant."""
    cr = cosmic_ray(args.cosmic_ray)
    tools = cr.parent
    argv = [args.python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not slow", *tests]
    command = shlex.join(argv)
    name = re.sub(r"\W", "_", module)
    config, session = work / f"{name}.toml", work / f"{name}.sqlite"
    config.write_text("\n".join([
        "[cosmic-ray]", f'module-path = "{module}"', f"timeout = {args.timeout}", "excluded-modules = []",
        f"test-command = {json.dumps(command)}",
        "[cosmic-ray.distributor]", 'name = "local"',
        "[cosmic-ray.filters.operators-filter]", f"exclude-operators = {json.dumps(EXCLUDED_OPERATORS)}",
        "[cosmic-ray.filters.line-filter]", f"lines = {{ {json.dumps(module)} = {json.dumps(spans)} }}", ""]))
    env = {**os.environ, "PYTHONPATH": f"{work}{os.pathsep}{work / 'plugins'}", "OMP_NUM_THREADS": "1"}
    run = lambda *cmd: subprocess.run([str(c) for c in cmd], cwd=work, env=env, check=True,  # noqa: E731
                                      stdout=subprocess.DEVNULL if not args.verbose else None)
    baseline = None if args.count else subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True)
    if baseline and baseline.returncode:
        raise SystemExit(f"mutate: the tests of {module} fail unmutated:\n{baseline.stdout[-2000:]}")
    run(cr, "init", config, session)
    run(tools / "cr-filter-operators", session, config)
    run(tools / "cr-filter-lines", "--config", config, session)
    if args.sample:
        subprocess.run([str(tools / "python"), "-c", SAMPLE, str(session), str(args.sample), str(args.seed)], check=True)
    if args.count:
        dump = subprocess.run([str(cr), "dump", str(session)], capture_output=True, text=True, check=True).stdout
        pending = sum(json.loads(line)[1] is None for line in dump.splitlines())
        return [{"module": module, "outcome": "pending"}] * pending
    run(cr, "exec", config, session)
    dump = subprocess.run([str(cr), "dump", str(session)], cwd=work, env=env, check=True, capture_output=True, text=True)
    results = []
    for line in dump.stdout.splitlines():
        job, result = json.loads(line)
        if result is None or result.get("worker_outcome") == "skipped":
            continue
        mutation = job["mutations"][0]
        results.append({"module": module, "line": mutation["start_pos"][0], "operator": mutation["operator_name"],
                        "outcome": result["test_outcome"] or result["worker_outcome"], "diff": result.get("diff") or ""})
    return results


def mutated_line(diff: str) -> str:
    return next((line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")),
                "")


def _scratch(folder: str, names: list[str]) -> set[str]:
    """What the copy of the tree leaves out: caches, and models and weights made by runs (not the corpus
    committed under tests/data, which tests read)."""
    made = shutil.ignore_patterns("*.onnx", "*.data")(folder, names)
    keep = "tests/data" in Path(folder).as_posix()
    return shutil.ignore_patterns("__pycache__")(folder, names) | (set() if keep else made)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("modules", nargs="*", help="path[:start-end] of modules to mutate (default: --base's changes)")
    p.add_argument("--base", help="git revision: mutate the trtattn/ lines changed since it (of the modules given)")
    p.add_argument("--tests", nargs="+", help="pytest arguments for every module (default: per module, see above)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per mutant's test run (past it: killed)")
    p.add_argument("--python", default=sys.executable, help="the interpreter that runs the tests")
    p.add_argument("--cosmic-ray", help="the cosmic-ray executable (its cr-* tools beside it)")
    p.add_argument("--count", action="store_true", help="only count each module's mutants (no test runs)")
    p.add_argument("--sample", type=int, help="mutate a seeded random sample of at most N mutants per module")
    p.add_argument("--seed", type=int, default=0, help="the sample's seed")
    p.add_argument("--json", help="write every mutant's outcome here")
    p.add_argument("--verbose", action="store_true")
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
    results = []
    with tempfile.TemporaryDirectory(prefix="trtattn-mutate-") as tmp:
        work = Path(tmp)
        for item in COPIED:
            src = ROOT / item
            (shutil.copytree(src, work / item, ignore=_scratch)
             if src.is_dir() else shutil.copy2(src, work / item))
        for module, spans in sorted(lines.items()):
            tests = args.tests or tests_for(module)
            print(f"mutate: {module} lines {','.join(spans)} against {' '.join(tests)}", flush=True)
            found = run_module(module, spans, tests, args, work)
            if args.count:
                print(f"  {len(found)} mutants", flush=True)
                results += found
                continue
            killed = sum(r["outcome"] == "killed" for r in found)
            print(f"  {killed}/{len(found)} killed" + (f" ({killed / len(found):.0%})" if found else ""), flush=True)
            results += found
    if args.count:
        print(f"mutants: {len(results)}")
        return 0
    survivors = [r for r in results if r["outcome"] != "killed"]
    for r in survivors:
        print(f"SURVIVED {r['module']}:{r['line']} {r['operator']} ({r['outcome']}): {mutated_line(r['diff'])}")
    total = len(results)
    print(f"kill rate: {total - len(survivors)}/{total}" + (f" = {(total - len(survivors)) / total:.0%}" if total else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
