"""A tensor-parallel rank set (`trtattn build --tp N`) run on N GPUs: one process per rank.

    rank_set = read_rank_set("engines/llama.tp.json")   # or one rank's engine: its sidecar names the set
    commands = rank_commands(rank_set, argv, "engines/llama.tp.json", port=free_port())
    code = launch(commands)                              # rank 0's stdout is the command's output

Each rank process runs the same `trtattn run|bench` command line with the set replaced by its rank's
engine, its environment saying which rank it is (RANK_ENV, RANKS_ENV), which CUDA device it takes
(DEVICE_ENV: device r of those visible, CUDA_VISIBLE_DEVICES left as the user set it, so NCCL sees every
GPU for peer-to-peer) and where the ranks meet (NCCL_COMM_ID=127.0.0.1:PORT, NCCL's own variable, as
MASTER_ADDR:MASTER_PORT is torch.distributed's). In a rank process `session_options()` sets the device,
makes the NCCL communicator (trt/nccl.py) and hands both to the TensorRT session, whose execution context
takes the communicator (IExecutionContext.set_communicator). Every rank runs the same feeds (the same
--inputs, or generated from the same --seed), so its collectives meet the others'; after the ALL_GATHER
of the logits every rank holds the same logits, so greedy decoding picks the same tokens on every rank and
the ranks stay in step. Only rank 0 prints and saves.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..contract import PIPELINE_JSON, is_engine_path, load_sidecar
from ..errors import TrtattnError

RANK_ENV, RANKS_ENV, DEVICE_ENV = "TRTATTN_RANK", "TRTATTN_RANKS", "TRTATTN_DEVICE"
MEET_ENV = "NCCL_COMM_ID"  # <host>:<port> of rank 0's NCCL bootstrap root
RANK_NAME = re.compile(r"^(?P<name>.+)\.rank(?P<rank>\d+)of(?P<ranks>\d+)$")


@dataclass(frozen=True)
class RankSet:
    name: str
    ranks: int
    models: list[Path]  # what rank r is given as MODEL: its engine, or the folder of a pipeline
    source: Path  # NAME.tp.json, the rank engine it was read from, or a pipeline.json
    engines: list[Path] | None = None  # every engine the ranks open (default: `models`)

    @property
    def needed(self) -> list[Path]:
        return self.models if self.engines is None else self.engines


@dataclass(frozen=True)
class RankCommand:
    rank: int
    argv: list[str]
    env: dict[str, str] = field(repr=False)
    device: int = 0

    def env_shown(self) -> dict[str, str]:
        """What this launch sets (the rest is inherited)."""
        return {k: self.env[k] for k in (RANK_ENV, RANKS_ENV, DEVICE_ENV, MEET_ENV)}


def read_rank_set(model) -> RankSet | None:
    """The rank set `model` names: NAME.tp.json (its `ranks` list the engines, beside it), one rank's
    engine whose sidecar says it is rank r of N (the others are NAME.rankKofN.engine beside it), or a folder
    `build DIR --tp N` wrote (its pipeline.json: every rank is given the folder and takes its own engine of
    each part). None: not a rank set."""
    path = Path(model)
    if path.is_dir():
        return _folder_set(path)
    if path.name.endswith(".tp.json") and path.is_file():
        try:
            plan = json.loads(path.read_text())
        except ValueError as e:
            raise TrtattnError(f"{path}: not a valid rank-set sidecar ({e})") from None
        if "parts" in plan and "ranks" not in plan:
            raise TrtattnError(f"{path} describes an export folder's rank sets ({', '.join(plan['parts'])}): run "
                               f"--generate over {path.parent} (pipeline.json) or give one part's NAME.tp.json")
        n = int(plan["tensor_parallel"])
        name = path.name[: -len(".tp.json")]
        entries = sorted(plan.get("ranks") or [], key=lambda r: r.get("rank", 0))
        engines = [path.parent / e.get("engine", f"{name}.rank{r}of{n}.engine") for r, e in enumerate(entries)]
        if len(engines) != n:
            engines = [path.parent / f"{name}.rank{r}of{n}.engine" for r in range(n)]
        return RankSet(name, n, engines, path)
    if not is_engine_path(path) or not path.with_suffix(".json").is_file():
        return None
    try:
        tp = (load_sidecar(path) or {}).get("tensor_parallel")
    except TrtattnError:
        return None
    if not isinstance(tp, dict):
        return None
    n = int(tp["ranks"])
    found = RANK_NAME.match(path.stem)
    if found is None or int(found["ranks"]) != n:
        raise TrtattnError(f"{path}: its sidecar says rank {tp.get('rank')} of {n}, but the file is not named "
                           f"NAME.rankRof{n}{path.suffix}: the other ranks' engines cannot be found")
    name = found["name"]
    return RankSet(name, n, [path.with_name(f"{name}.rank{r}of{n}{path.suffix}") for r in range(n)], path)


def _folder_set(folder: Path) -> RankSet | None:
    sidecar = folder / PIPELINE_JSON
    try:
        meta = json.loads(sidecar.read_text()) if sidecar.is_file() else {}
    except ValueError as e:
        raise TrtattnError(f"{sidecar}: not readable JSON ({e})") from None
    n = meta.get("tensor_parallel")
    if not n:
        return None
    engines = [folder / e for p in meta.get("parts", {}).values() for e in p.get("ranks", [])]
    return RankSet(folder.name, int(n), [folder] * int(n), sidecar, engines)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now, for rank 0's NCCL bootstrap root."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def rank_commands(rank_set: RankSet, argv: list[str], model: str, *, port: int, command: str | None = None,
                  python: str = sys.executable, env: dict[str, str] | None = None,
                  host: str = "127.0.0.1") -> list[RankCommand]:
    """One command line per rank: `python -m trtattn ARGV` with `model` (the set as the user named it, after
    the sub-command `command`) replaced by the rank's engine (-q for ranks > 0), and the rank's environment
    (`env`: the parent's, default os.environ). A NCCL_COMM_ID the user set (another host) is kept."""
    argv = [str(a) for a in argv]
    start = argv.index(command) + 1 if command in argv else 0
    try:
        at = argv.index(str(model), start)
    except ValueError:
        raise TrtattnError(f"cannot find {model} on the command line {' '.join(argv)} to give each rank its engine") from None
    missing = [str(e) for e in rank_set.needed if not e.is_file()]
    if missing:
        raise TrtattnError(f"{rank_set.source}: rank engine{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                           "not found (build them with trtattn build --tp on a GPU machine)")
    base = dict(os.environ if env is None else env)
    meet = base.get(MEET_ENV) or f"{host}:{port}"
    commands = []
    for r, engine in enumerate(rank_set.models):
        rank_env = {**base, RANK_ENV: str(r), RANKS_ENV: str(rank_set.ranks), DEVICE_ENV: str(r), MEET_ENV: meet}
        quiet = ["-q"] if r else []  # progress from rank 0 alone (the others' errors still show)
        rank_argv = [python, "-m", "trtattn", *quiet, *argv[:at], str(engine), *argv[at + 1:]]
        commands.append(RankCommand(r, rank_argv, rank_env, r))
    return commands


def launch(commands: list[RankCommand], *, poll: float = 0.1) -> int:
    """Run the rank processes together; rank 0's stdout is shown, the others' discarded (their stderr is
    shown). The first rank that fails ends the others (they would wait in NCCL for it forever) and its
    exit code is returned (128 + the signal for a rank killed by one); 0 when all succeed."""
    procs = []
    try:
        for c in commands:
            procs.append(subprocess.Popen(c.argv, env=c.env, stdout=None if c.rank == 0 else subprocess.DEVNULL))
        while True:
            codes = [p.poll() for p in procs]
            failed = next((code for code in codes if code not in (None, 0)), None)
            if failed is not None:
                return failed if failed > 0 else 128 - failed  # killed by a signal: as a shell says it
            if all(code == 0 for code in codes):
                return 0
            time.sleep(poll)
    finally:
        for p in procs:  # only the processes this launch started
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def this_rank() -> tuple[int, int, int] | None:
    """(rank, ranks, device) when this process is one rank of a launched set, else None."""
    if RANK_ENV not in os.environ:
        return None
    try:
        rank, ranks = int(os.environ[RANK_ENV]), int(os.environ[RANKS_ENV])
        device = int(os.environ.get(DEVICE_ENV, rank))
    except (KeyError, ValueError):
        raise TrtattnError(f"{RANK_ENV}/{RANKS_ENV}/{DEVICE_ENV} must be integers (set by the rank-set launcher)") from None
    return rank, ranks, device


def is_secondary_rank() -> bool:
    """A rank other than 0 of a launched set: it runs, but does not print or save."""
    me = this_rank()
    return me is not None and me[0] != 0


_COMMUNICATORS: list = []  # this process's NCCL communicator, alive as long as the process


def session_options(engine) -> dict:
    """The TensorRT session options of a rank process for its engine (device, communicator); {} elsewhere."""
    me = this_rank()
    if me is None or not is_engine_path(engine):
        return {}
    rank, ranks, device = me
    tp = ((load_sidecar(engine) or {}).get("tensor_parallel")) or {}
    if (tp.get("rank"), tp.get("ranks")) != (rank, ranks):
        what = f"rank {tp.get('rank')} of {tp.get('ranks')}" if tp else "not a rank engine"
        raise TrtattnError(f"{engine} is {what}, but this process was launched as rank {rank} of {ranks}")
    from ..trt.cuda import Cuda
    from ..trt.nccl import Communicator

    Cuda.load().set_device(device)  # NCCL binds the communicator to the current device
    if not _COMMUNICATORS:
        _COMMUNICATORS.append(Communicator.init(ranks, rank))
    return {"device": device, "communicator": _COMMUNICATORS[0].capsule()}
