"""Count `x["key"]` / `x.get("key")` reads of dicts made in another package (issue 35: no string-keyed result dict
crosses a package boundary). Run from the project root: `python benchmarks/dict_reads.py [-v]`.

An approximation from the source alone (no types), so it says what it counts. A package is trtattn's first level
(trtattn.routes, trtattn.cli, trtattn.site). A read counts when its constant string key is read from:
  - call: a name bound from (or a call to) a function imported from another package, or an element of one
    (`for e in f(...)`, tuple unpacking), or a `.row()` result (also a list of them);
  - field: `obj.field[...]`, or an element of `obj.field`, where `field` is a dict/list annotated field of a
    class defined in another package (whatever the module's own package also declares): `plan.limits["max_batch"]`,
    `for i in plan.inputs: i["name"]`.
It misses dicts passed in as parameters and reached through locals it cannot follow, and it may count a field
whose name another package's class shares. JSON loaded from disk (json.load) and keys written (`info["io"] = ...`)
are not counted: that is the edge.
"""

from __future__ import annotations

import ast
import os
import sys
from collections import Counter

PKG = "trtattn"


def modname(path: str) -> str:
    rel = os.path.relpath(path)[:-3].replace(os.sep, ".")
    return rel[:-9] if rel.endswith(".__init__") else rel


def package(mod: str) -> str:
    return ".".join(mod.split(".")[:2])


def _absolute(mod: str, is_init: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = mod.split(".") if is_init else mod.split(".")[:-1]
    base = parts[: len(parts) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _is_dict_annotation(ann: ast.expr | None) -> bool:
    text = ast.unparse(ann) if ann is not None else ""
    return "dict" in text.lower() and "Dict" not in text.replace("dict", "") or text.startswith("list[dict")


def dict_fields(trees: dict[str, ast.Module]) -> dict[str, set[str]]:
    """field name -> the packages whose classes declare it as a dict (or list of dicts)."""
    fields: dict[str, set[str]] = {}
    for mod, tree in trees.items():
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for stmt in cls.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) \
                        and _is_dict_annotation(stmt.annotation):
                    fields.setdefault(stmt.target.id, set()).add(package(mod))
    return fields


class Reads(ast.NodeVisitor):
    """The counted reads of one module."""

    def __init__(self, mod: str, is_init: bool, fields: dict[str, set[str]]):
        self.mod, self.pkg, self.fields = mod, package(mod), fields
        self.is_init = is_init
        self.imported: dict[str, str] = {}  # local name -> the module it comes from
        self.tainted: dict[str, str] = {}  # local name -> why it is a foreign dict
        self.found: list[tuple[int, str, str]] = []

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.name.startswith(PKG):
                self.imported[(a.asname or a.name).split(".")[0]] = a.name

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        src = _absolute(self.mod, self.is_init, node)
        if src.startswith(PKG):
            for a in node.names:
                self.imported[a.asname or a.name] = f"{src}.{a.name}"

    def _foreign_call(self, node: ast.expr) -> str | None:
        if not isinstance(node, ast.Call):
            return None
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "row":
            return "call .row()"
        root = f
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id in self.imported:
            src = self.imported[root.id]
            if package(src) != self.pkg:
                return f"call {ast.unparse(f)}"
        return None

    def _foreign_field(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Attribute) and self.fields.get(node.attr, {self.pkg}) - {self.pkg}:
            return f"field .{node.attr}"
        return None

    def _source(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return self.tainted.get(node.id)
        if isinstance(node, ast.Subscript) and not _string_key(node):  # an element of a foreign list
            return self._source(node.value)
        if isinstance(node, ast.ListComp):  # [r.row() for r in reports]
            return self._foreign_call(node.elt)
        return self._foreign_call(node) or self._foreign_field(node)

    def _bind(self, target: ast.expr, why: str | None) -> None:
        for name in (n for n in ast.walk(target) if isinstance(n, ast.Name)):
            if why:
                self.tainted[name.id] = why
            else:
                self.tainted.pop(name.id, None)

    def visit_FunctionDef(self, node) -> None:  # a function's locals are its own
        outer = dict(self.tainted)
        self.generic_visit(node)
        self.tainted = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        for t in node.targets:
            if isinstance(t, ast.Tuple) and isinstance(node.value, ast.Tuple) and len(t.elts) == len(node.value.elts):
                for te, ve in zip(t.elts, node.value.elts):
                    self._bind(te, self._source(ve))
            else:
                self._bind(t, self._source(node.value))

    def visit_For(self, node: ast.For) -> None:
        self._bind(node.target, self._source(node.iter))
        self.generic_visit(node)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        self._bind(node.target, self._source(node.iter))
        self.generic_visit(node)

    def visit_ListComp(self, node) -> None:  # generators first: their targets are bound before the element reads
        for g in node.generators:
            self.visit(g)
        self.visit(node.elt)

    visit_SetComp = visit_GeneratorExp = visit_ListComp

    def visit_DictComp(self, node: ast.DictComp) -> None:
        for g in node.generators:
            self.visit(g)
        self.visit(node.key)
        self.visit(node.value)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        key = _string_key(node) if isinstance(node.ctx, ast.Load) else None  # a key written is the JSON edge
        why = self._source(node.value) if key else None
        if why:
            self.found.append((node.lineno, f'{ast.unparse(node.value)}["{key}"]', why))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "get" and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            why = self._source(f.value)
            if why:
                self.found.append((node.lineno, f'{ast.unparse(f.value)}.get("{node.args[0].value}")', why))
        self.generic_visit(node)


def _string_key(node: ast.Subscript) -> str | None:
    s = node.slice
    return s.value if isinstance(s, ast.Constant) and isinstance(s.value, str) else None


def main(argv: list[str]) -> int:
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(PKG) for f in fs if f.endswith(".py"))
    trees = {modname(f): ast.parse(open(f, encoding="utf-8").read()) for f in files}
    fields = dict_fields(trees)
    by_why: Counter[str] = Counter()
    total = 0
    for f in files:
        reads = Reads(modname(f), f.endswith("__init__.py"), fields)
        reads.visit(trees[modname(f)])
        for line, text, why in reads.found:
            total += 1
            by_why[why.split()[0] + " " + why.split()[-1]] += 1
            if "-v" in argv:
                print(f"{f}:{line}: {text}  ({why})")
    print(f"{total} string-keyed reads of dicts from another package")
    for why, n in by_why.most_common():
        print(f"  {n:4d}  {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
