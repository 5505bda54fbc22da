"""What each axis of a tensor means: the axis-tracking layer the attention matcher stands on.

A *frame* gives, for each axis of a tensor, the *atoms* it holds: the batch, the heads, the query
and key positions, the head dims. An axis holds one atom, several merged in row-major order (heads
merged into the batch: ("x0", "h")), or none (a unit axis, `()`). The two contractions of an
attention label the atoms (contraction.py); the layout ops between them move atoms around, one rule
per op (layout_ops.py). Here: the frames, `Atoms` (the per-site registry: sizes learned from shapes,
atoms split when a Reshape splits a merged axis, x0 -> x0.0, x0.1; lengths a constant Reshape target
writes into the graph) and `regroup`, what a Reshape does to a frame.

Dims are ints and names from shape inference, or `Sizes` measured by running the model at two sizes
(graph/measure.py) where inference left fresh symbols: then an atom's size may be a measured one too
(the batch: 2 at one run, 4 at the other), and runs of atoms fill a dim when the numbers say so.
"""

from __future__ import annotations

import itertools
import math
import re

import numpy as np

from ..graph.dim_names import is_free
from ..graph.measure import Sizes
from .errors import Unsupported

Group = tuple  # atoms merged in one axis, row-major ("x0", "h"); () for a unit axis
Frame = tuple  # one Group per axis


class Unfollowable(Unsupported):
    """A layout op whose effect on the axes cannot be worked out."""


def atoms_of(frame: Frame) -> list[str]:
    return [a for g in frame for a in g]


def show(frame: Frame) -> str:
    return "[" + ", ".join("*".join(g) if g else "1" for g in frame) + "]"


class Atoms:
    """Sizes, splits and run-time dims of one site's atoms."""

    def __init__(self):
        self.size: dict[str, int | None] = {}
        self.symbol: dict[str, str] = {}  # a dim name an inference gave an atom alone on an axis
        self.dynamic: set[str] = set()  # atoms seen alone on an axis of a symbolic (or -1) dim
        self.unnamed: set[str] = set()  # atoms seen alone on an axis inference could only call unk__N
        self.hard_coded: dict[str, tuple[int, str]] = {}  # atom -> (size, Reshape) a constant target gives it
        self.parts: dict[str, tuple[str, ...]] = {}  # atom -> the atoms it was split into
        # atom -> (Reshape target, index): where a Reshape computes the size of an axis holding it alone
        self.entries: dict[str, tuple[str, int]] = {}
        self.broadcast: set[str] = set()  # batch atoms a product broadcasts an operand of size 1 over
        self.measure: dict[str, Sizes] = {}  # atom -> its size at each measured run, where that varies

    def copy(self) -> Atoms:
        c = Atoms()
        c.size, c.symbol, c.parts, c.measure = dict(self.size), dict(self.symbol), dict(self.parts), dict(self.measure)
        c.dynamic, c.unnamed, c.hard_coded = set(self.dynamic), set(self.unnamed), dict(self.hard_coded)
        c.entries, c.broadcast = dict(self.entries), set(self.broadcast)
        return c

    def adopt(self, other: Atoms) -> None:
        """Take what `other` (a copy of this registry that a trial worked on) learned."""
        self.__dict__.update(other.copy().__dict__)

    def sizes(self, a: str, runs: int) -> tuple[int, ...] | None:
        """An atom's size at each of `runs` measured runs: its static size every time, or what was measured."""
        s = self.size.get(a)
        return (s,) * runs if s is not None else self.measure.get(a)

    def new(self, name: str, size: int | None = None) -> str:
        self.size.setdefault(name, size)
        return name

    def known(self, a: str) -> int | None:
        return self.size.get(a)

    # ------------------------------------------------------------ splits
    def resolve(self, frame: Frame) -> Frame:
        """The frame with every split atom replaced by its parts."""
        return tuple(tuple(x for a in g for x in self._leaves(a)) for g in frame)

    def _leaves(self, a: str) -> list[str]:
        if a not in self.parts:
            return [a]
        return [x for p in self.parts[a] for x in self._leaves(p)]

    def split(self, a: str, sizes: list[int | None]) -> tuple[str, ...]:
        parts = tuple(self.new(f"{a}.{i}", s) for i, s in enumerate(sizes))
        self.parts[a] = parts
        return parts

    def learn(self, frame: Frame, dims: list | None) -> None:
        """Sizes and names of atoms alone on an axis, from that axis' dim."""
        if dims is None or len(dims) != len(frame):
            return
        if dims and all(isinstance(d, Sizes) for d in dims):
            self._learn_measured(frame, dims)
            return
        for g, d in zip(self.resolve(frame), dims):
            if d == 1 and any(a in self.broadcast for a in g):
                continue  # a tensor that is broadcast over this axis says nothing of its size
            unknown = [a for a in g if self.known(a) is None]
            if isinstance(d, int) and d > 0 and len(unknown) == 1:
                rest = math.prod(s for a in g if a != unknown[0] if (s := self.known(a)) is not None)
                if rest and d % rest == 0:
                    self.size[unknown[0]] = d // rest
            elif isinstance(d, str) and len(g) == 1 and not d.startswith("unk__"):
                self.symbol.setdefault(g[0], d)
        self.note_symbolic(frame, dims)

    def note_symbolic(self, frame: Frame, dims: list | None) -> None:
        """Atoms alone on an axis whose inferred dim is symbolic (or -1): `dynamic`, or `unnamed` where the
        name is a fresh symbol, which says nothing of whether the dim varies. Also where a layout op follows
        measured dims instead: what inference names after the inputs still tells which lengths vary."""
        if dims is None or len(dims) != len(frame):
            return
        for g, d in zip(self.resolve(frame), dims):
            if len(g) != 1 or isinstance(d, Sizes):
                continue
            if isinstance(d, str) and is_free(d):
                self.unnamed.add(g[0])
            elif isinstance(d, str) or (isinstance(d, int) and d < 0):
                self.dynamic.add(g[0])

    def _learn_measured(self, frame: Frame, dims: list[Sizes]) -> None:
        """Sizes of atoms alone of their size on an axis, from its measured dim: static where the runs agree."""
        runs = len(dims[0])
        for g, d in zip(self.resolve(frame), dims):
            unknown = [a for a in g if self.sizes(a, runs) is None]
            if len(unknown) != 1:
                continue
            rest = [math.prod(s) for s in zip(*(self.sizes(a, runs) for a in g if a != unknown[0]))] or [1] * runs
            if all(x % r == 0 for x, r in zip(d, rest)):
                size = Sizes(x // r for x, r in zip(d, rest))
                if size.static:
                    self.size[unknown[0]] = size[0]
                else:
                    self.measure[unknown[0]] = size
                    if len(g) == 1:
                        self.dynamic.add(g[0])

    def baked(self, atoms: tuple[str, ...], lengths_vary: bool = True) -> list[tuple[str, int, str]]:
        """(atom, size, Reshape) for each of `atoms` a constant Reshape target fixes although it is a
        symbolic dim elsewhere: the graph means something else at other lengths. A dim inference could only
        call unk__N counts as symbolic when `lengths_vary`: the model's inputs have a symbolic dim besides
        the batch (a model whose only symbolic dim is the batch has static lengths, whatever inference says)."""
        return [(a, *self.hard_coded[a]) for a in atoms if a in self.hard_coded
                and (a in self.dynamic or (lengths_vary and a in self.unnamed))]


# ---------------------------------------------------------------- dims
def monomial(d) -> tuple[int, tuple[str, ...]] | None:
    """A dim as (coefficient, names): 8 -> (8, ()), 'batch' -> (1, ('batch',)), '4*batch' ->
    (4, ('batch',)); None for unknown dims and expressions with + or -."""
    if isinstance(d, (int, np.integer)) and d > 0:
        return int(d), ()
    if not isinstance(d, str) or d.startswith("unk__") or re.search(r"[-+/()]", d):
        return None
    coef, names = 1, []
    for f in d.replace(" ", "").split("*"):
        if f.isdigit():
            coef *= int(f)
        elif f:
            names.append(f)
    return coef, tuple(sorted(names))


def _run_ok(atoms: Atoms, run: list[str], d) -> tuple[bool, int]:
    """Can atoms `run` (merged) fill an axis of dim `d`, and how plausible is it (higher is better)."""
    if isinstance(d, Sizes):
        return _run_fits(atoms, run, d)
    sizes = [atoms.known(a) for a in run]
    unknown = [s for s in sizes if s is None]
    static = math.prod(s for s in sizes if s is not None)
    if isinstance(d, (int, np.integer)) and d > 0:
        if d == 1:  # size-1 atoms, or batch atoms this tensor is broadcast over
            return all(atoms.known(a) == 1 or a in atoms.broadcast for a in run), 0
        if not unknown:
            return static == d, 0
        return (len(unknown) == 1 and d % static == 0), -2  # an atom of unknown size would be d / static
    if not run:
        return False, 0
    m = monomial(d)
    if m is not None and m[1]:
        names = [atoms.symbol.get(a) for a in run if atoms.known(a) is None]
        named = [n for n in names if n is not None]
        if len(named) == len(names) and sorted(named) == list(m[1]) and static == m[0]:
            return True, 3  # the inference names exactly these atoms
    if unknown:
        return True, 0
    return True, -1  # all static, the inference did not know: possible


def _run_fits(atoms: Atoms, run: list[str], d: Sizes) -> tuple[bool, int]:
    """_run_ok for a measured dim: the atoms' sizes must multiply to it at every run."""
    sizes = [atoms.sizes(a, len(d)) for a in run]
    known = [s for s in sizes if s is not None]
    product = tuple(math.prod(x) for x in zip(*known)) if known else (1,) * len(d)
    unknown = len(sizes) - len(known)
    if not unknown:
        return product == tuple(d), (0 if d.static else 3)  # a varying size matched exactly: strong evidence
    if d.static and d[0] == 1:
        return False, 0
    return all(x % p == 0 for x, p in zip(d, product)), (-1 if unknown == 1 else -3)


def _splits(n: int, k: int):
    """Every way to cut n items into k consecutive (possibly empty) runs: the cut points."""
    for cuts in itertools.combinations_with_replacement(range(n + 1), k - 1):
        yield (0, *cuts, n)


def _best(atoms: Atoms, seq: list[str], frame: Frame, dims_to: list) -> list[list[str]] | None:
    bounds = set(itertools.accumulate(len(g) for g in frame))
    groups = [list(g) for g in frame]
    best, best_score, tied = None, None, False
    for cuts in _splits(len(seq), len(dims_to)):
        runs = [seq[a:b] for a, b in zip(cuts, cuts[1:])]
        score = 0
        for run, d, (a, b) in zip(runs, dims_to, zip(cuts, cuts[1:])):
            ok, s = _run_ok(atoms, run, d)
            if not ok:
                break
            # runs that keep whole axes of the known side are what reshapes usually do
            score += s + (1 if run and (a == 0 or a in bounds) and b in bounds else 0)
        else:
            # and they keep the trailing axes (positions, head dims) as they are, regrouping the batch
            for run, g in zip(reversed(runs), reversed(groups)):
                if run != g:
                    break
                score += 1
            if best_score is None or score > best_score:
                best, best_score, tied = runs, score, False
            elif score == best_score and best is not None and not _same_up_to_units(atoms, runs, best):
                tied = True
    return None if tied else best


def _same_up_to_units(atoms: Atoms, a: list[list[str]], b: list[list[str]]) -> bool:
    """Two groupings that differ only in where size-1 atoms sit mean the same layout."""
    strip = lambda runs: [[x for x in r if atoms.known(x) != 1] for r in runs]  # noqa: E731
    return strip(a) == strip(b)


def regroup(atoms: Atoms, frame: Frame, dims_from: list | None, dims_to: list | None, what: str) -> Frame:
    """The frame of a tensor of dims `dims_to` with the elements, in the same order, of a tensor of
    frame `frame` and dims `dims_from`: a Reshape read in either direction. Splits an atom of
    unknown size when a static dim asks for it (B*N -> B, N)."""
    if dims_to is None:
        raise Unfollowable(f"{what}: the shape it gives is unknown")
    atoms.learn(frame, dims_from)
    frame = atoms.resolve(frame)
    seq = atoms_of(frame)
    runs = _best(atoms, seq, frame, dims_to)
    if runs is None:
        runs = _refined(atoms, frame, seq, dims_to)
    if runs is None:
        raise Unfollowable(f"{what}: cannot tell how {show(frame)} regroups into {list(dims_to)}")
    out = tuple(tuple(r) for r in runs)
    atoms.learn(out, dims_to)
    return out


def _refined(atoms: Atoms, frame: Frame, seq: list[str], dims_to: list) -> list[list[str]] | None:
    """Split one batch atom in two so that a static dim of the other side can be matched: an unknown B*N
    into (unknown, N) or (N, unknown), static heads 4 into (2, 2) (GQA). The static part must land alone on
    an axis of its size (a size taken from an unrelated axis is a guess). Failing that, an unknown batch
    atom splits into two unknown parts where the other side has one more dim of unknown size (Swin's
    [B*nW, ...] -> [B, nW, ...], nW computed at run time). The single best split wins; positions and head
    dims are never split."""
    statics = sorted({int(d) for d in dims_to if isinstance(d, (int, np.integer)) and d > 1}
                     | {d[0] for d in dims_to if isinstance(d, Sizes) and d.static and d[0] > 1})
    # a part may share its static dim with atoms of known size (B*N into B and N*H = 32, H = 16: N = 2)
    known = {s for x in seq if (s := atoms.known(x)) is not None and s > 1}
    statics = sorted(set(statics) | {d // s for d in statics for s in known if d % s == 0 and d // s > 1})
    found = []
    for a in (x for x in seq if x.startswith("x")):
        size = atoms.known(a)
        for d in statics:
            options: list[list[int | None]] = [[None, d], [d, None]] if size is None else \
                ([[size // d, d]] if size % d == 0 and d < size else [])
            for sizes in options:
                runs = _trial_split(atoms, frame, dims_to, a, sizes)
                guessed = f"{a}.{sizes.index(d, 1 if size is not None else 0)}"
                if runs is not None and _alone_on(runs, dims_to, guessed, d):
                    score = sum(_run_ok(_with_split(atoms, a, sizes), r, d2)[1] for r, d2 in zip(runs, dims_to))
                    found.append((score, a, sizes, runs))
    if not found:
        found = [(0, a, [None, None], runs) for a in seq if a.startswith("x") and atoms.known(a) is None
                 if (runs := _trial_split(atoms, frame, dims_to, a, [None, None])) is not None]
        if len(found) != 1:
            return None  # no split, or several atoms that could be the one split
    found.sort(key=lambda f: -f[0])
    if len(found) > 1 and found[1][0] == found[0][0] and found[1][3] != found[0][3]:
        return None  # two different splits explain it equally well
    _, a, sizes, _ = found[0]
    atoms.split(a, sizes)
    return _best(atoms, atoms_of(atoms.resolve(frame)), atoms.resolve(frame), dims_to)


def _with_split(atoms: Atoms, a: str, sizes: list[int | None]) -> Atoms:
    trial = atoms.copy()
    trial.split(a, sizes)
    return trial


def _trial_split(atoms: Atoms, frame: Frame, dims_to: list, a: str, sizes: list[int | None]):
    """The runs `_best` finds with atom `a` split into parts of `sizes` (on a copy of the registry)."""
    trial = _with_split(atoms, a, sizes)
    tframe = trial.resolve(frame)
    return _best(trial, atoms_of(tframe), tframe, dims_to)


def _alone_on(runs: list[list[str]], dims_to: list, part: str, size: int) -> bool:
    """Part `part` is alone on an axis whose dim is its size."""
    return any(r == [part] and (d == size if isinstance(d, (int, np.integer)) else
                                isinstance(d, Sizes) and d.static and d[0] == size) for r, d in zip(runs, dims_to))
