"""Scanning a rank set: every rank file read once, in parallel, into one small summary each.

A run of a thousand ranks leaves a thousand files; the first (step, rank) over them is the minimum
of what each file says (:func:`~replay.ranks.first_bad.rank_evidence`), so each file is read in
a worker process of its own (h5py and numpy only: no torch is imported on this path) and hands
back a :class:`RankFileScan` of a few numbers. ``benchmarks/bench_rankscan.py`` measures it on
1,024 generated rank files.

A rank set with a rank's file missing (a gap in the rank numbers, or fewer files than the world
size each file records) or damaged (truncated, unreadable) cannot say which rank went bad first:
:meth:`RankScan.check` raises :class:`~replay.errors.IncompleteRankSetError` (exit 7) naming
them, and nothing is guessed over the gap.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from ..errors import EntryPointError, IncompleteRankSetError, RecordingError
from ..reports.ranks import RankFailure, RankSet
from ..store.reader import claimed_size, open_recording
from ..store.validate import MAX_WORLD_SIZE
from ..trust import standing
from .first_bad import RankEvidence, describe_failure, first_bad_rank, rank_evidence
from .names import rank_of_name, resolve_rank_files

__all__ = [
    "RankFileScan",
    "RankScan",
    "rank_set",
    "scan_file",
    "scan_rank_set",
    "spans",
]

_PARALLEL_FROM = 32  # by default fewer files are read here: a worker pool costs more to start


@dataclass(frozen=True)
class RankFileScan:
    """One rank file: its rank, world size, steps and first failures, or why it is
    damaged (``damaged``: one line; the other fields are then what its name says)."""

    path: str
    rank: int | None
    world_size: int | None = None
    steps_total: int = 0
    evidence: RankEvidence | None = None
    damaged: str | None = None
    backend: str | None = None  # the process group's, as recorded
    fsdp: bool = False  # the model was sharded with FSDP2 (meta.distributed.fsdp)
    run_id: str = ""  # the same in every file of one run (docs/trust.md)
    foreign: str | None = None  # why this user does not vouch for its code (None: they do)


def scan_file(path: str) -> RankFileScan:
    """Read what one rank file says; a damaged file is named, never raised over."""
    named = rank_of_name(path)
    try:
        extent = claimed_size(path)
    except OSError as e:
        return RankFileScan(path, named, damaged=f"unreadable ({e.strerror or e})")
    if extent is not None and extent[0] < extent[1]:
        # Not opened: HDF5 retries a cut file's metadata reads for minutes.
        return RankFileScan(
            path, named, damaged=f"truncated ({extent[0]} of the {extent[1]} bytes it claims)"
        )
    try:
        with open_recording(path, health_only=True) as rec:
            d = rec.meta.get("distributed") or {}
            h = rec.health()
            if (h["raised"] == 1).any():
                # whose exception it was (its own, or a collective a peer failed) is in the
                # step's record: read the rings too
                with open_recording(path) as full:
                    evidence = rank_evidence(full, h)
            else:
                evidence = rank_evidence(rec, h)
            rank = d.get("rank", named)
            world = d.get("world_size")
            total = int(rec.status().get("steps_total") or len(h["step"]))
            vouched = standing(rec.meta, rec.sources, rec.run_id, rec.format_version)
            return RankFileScan(
                path,
                None if rank is None else int(rank),
                None if world is None else int(world),
                total,
                evidence,
                backend=d.get("backend"),
                fsdp=bool(d.get("fsdp")),
                run_id=rec.run_id,
                foreign=None if vouched.runs else vouched.why,
            )
    except RecordingError as e:
        return RankFileScan(path, named, damaged=_why(str(e), path))
    except (OSError, KeyError, ValueError) as e:  # h5py's own errors, past the reader's checks
        return RankFileScan(path, named, damaged=f"unreadable ({type(e).__name__}: {e})")


def _why(message: str, path: str) -> str:
    """A reader's error without the path it starts with (the scan names the file itself)."""
    return message[len(path) + 2 :] if message.startswith(path + ": ") else message


@dataclass(frozen=True)
class RankScan:
    """What :func:`scan_rank_set` found: every readable rank's :class:`RankFileScan`, the ranks
    without a file, the damaged files (rank -> one line) and the first (step, rank)."""

    spec: str
    world_size: int | None
    ranks: dict[int, RankFileScan]
    missing: tuple[int, ...] = ()
    damaged: dict[int, RankFileScan] = field(default_factory=dict)
    first_bad: RankFailure | None = None

    @property
    def paths(self) -> dict[int, str]:
        """The readable ranks' files, by rank."""
        return {r: f.path for r, f in self.ranks.items()}

    @property
    def complete(self) -> bool:
        return not self.missing and not self.damaged

    def problem(self) -> str | None:
        """One line naming the missing and damaged rank files, ``None`` for a whole set."""
        if self.complete:
            return None
        parts = []
        if self.missing:
            parts.append(f"no file for rank(s) {spans(list(self.missing))}")
        for r, f in list(self.damaged.items())[:3]:
            parts.append(f"rank {r}'s file {os.path.basename(f.path)} is damaged: {f.damaged}")
        if len(self.damaged) > 3:
            parts.append(f"{len(self.damaged) - 3} more damaged rank files")
        of = f" of {self.world_size}" if self.world_size else ""
        return (
            f"{self.spec}: an incomplete rank set{of} ({'; '.join(parts)}): the first bad "
            "(step, rank) cannot be known without every rank; restore the files, or replay one "
            "rank with --rank N --alone"
        )

    def culprit_file(self, rank: int | None = None) -> tuple[str, RankSet]:
        """The file ``replay bisect --alone`` replays and what the set showed: the culprit
        rank's (rank 0's when no rank failed, so a ``--until`` predicate has a file to search),
        or ``rank``'s."""
        f, paths = self.first_bad, self.paths
        if rank is None:
            rank = f.rank if f is not None else min(paths)
        return paths[rank], RankSet(self.spec, sorted(paths), f, rank, describe_failure(f))

    def check_one_run(self, trust: bool) -> None:
        """Before anything runs: every rank file carries the same run id (a rank set is one
        run, never files of several put side by side), and each one is vouched for by this user
        (docs/trust.md) unless ``trust`` (``--trust``)."""
        ids: dict[str, list[int]] = {}
        for r, f in sorted(self.ranks.items()):
            ids.setdefault(f.run_id, []).append(r)
        if len(ids) > 1:
            parts = [f"rank(s) {spans(rs)}: run {i[:8] or '(none)'}" for i, rs in ids.items()]
            raise EntryPointError(
                f"{self.spec}: the rank files are not of one run ({'; '.join(parts[:4])}"
                f"{'; ...' if len(parts) > 4 else ''}); replay runs nothing from a set of "
                "several runs: keep one run's files together (ranks recorded without a "
                "process group agree on one when their launcher sets one REPLAY_RUN_ID)"
            )
        foreign = {r: f for r, f in sorted(self.ranks.items()) if f.foreign is not None}
        if foreign and not trust:
            r, f = next(iter(foreign.items()))
            raise EntryPointError(
                f"{self.spec}: rank file(s) {spans(list(foreign))} are foreign (rank {r}: "
                f"{f.foreign}); replaying them would run their program (`replay info "
                f"{os.path.basename(f.path)}` names it): read it, then pass --trust (this once) "
                "or run `replay trust` on every rank file (remember it)"
            )

    def check(self) -> RankScan:
        """This scan, or :class:`IncompleteRankSetError` when a rank's file is missing or
        damaged."""
        problem = self.problem()
        if problem is not None:
            raise IncompleteRankSetError(problem)
        return self


def spans(ranks: list[int], most: int = 20) -> str:
    """``[0, 1, 2, 5]`` -> ``0..2, 5``: a thousand missing ranks are one line."""
    out: list[tuple[int, int]] = []
    for r in ranks:
        if out and out[-1][1] == r - 1:
            out[-1] = (out[-1][0], r)
        else:
            out.append((r, r))
    text = [f"{a}..{b}" if b > a else str(a) for a, b in out]
    return ", ".join(text[:most]) + (f", ... ({len(text) - most} more)" if len(text) > most else "")


def _read_all(files: list[str], workers: int | None) -> Iterable[RankFileScan]:
    n = workers if workers is not None else len(os.sched_getaffinity(0))
    if n <= 1 or (workers is None and len(files) < _PARALLEL_FROM):
        return [scan_file(p) for p in files]
    # forkserver: the workers start from a clean interpreter (never a fork of a process that
    # has torch's threads), importing only this module, h5py and numpy.
    ctx = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(max_workers=n, mp_context=ctx) as pool:
        return list(pool.map(scan_file, files, chunksize=max(1, len(files) // (n * 8))))


def scan_rank_set(
    spec: str | list[str],
    *,
    workers: int | None = None,
    strict: bool = True,
    name: str | None = None,
) -> RankScan:
    """Read every rank file of ``spec`` (a rank-set name, see
    :func:`~replay.ranks.names.resolve_rank_files`, or a list of rank files) and find the
    first (step, rank) that went bad.

    ``workers``: processes reading files (default: one per core; 1 reads here). ``strict``:
    raise :class:`IncompleteRankSetError` for a missing or damaged rank file (``replay info``
    passes False to list what it can, then says so). ``name``: what messages call the set.
    """
    if isinstance(spec, str):
        files = resolve_rank_files(spec)
        if files is None:
            raise RecordingError(f"{spec}: not a DDP rank set (NAME.rank<N>.h5 files)")
        name = name or spec
    else:
        files, name = list(spec), name or ", ".join(spec)
    ranks: dict[int, RankFileScan] = {}
    damaged: dict[int, RankFileScan] = {}
    worlds: set[int] = set()
    for f in _read_all(files, workers):
        if f.rank is None:
            raise RecordingError(f"{f.path}: not recorded under DDP and not named NAME.rank<N>.h5")
        seen = ranks.get(f.rank) or damaged.get(f.rank)
        if seen is not None:
            raise RecordingError(f"{name}: rank {f.rank} appears twice ({seen.path}, {f.path})")
        (damaged if f.damaged else ranks)[f.rank] = f
        if f.world_size is not None:
            worlds.add(f.world_size)
    if len(worlds) > 1:
        raise RecordingError(
            f"{name}: files of different runs (world sizes {sorted(worlds)}); "
            "name the files of one run"
        )
    world = worlds.pop() if worlds else None
    _check_bounded(name, world, [*ranks.values(), *damaged.values()])
    present = set(ranks) | set(damaged)
    top = max(world or 0, max(present, default=-1) + 1)
    missing = tuple(r for r in range(top) if r not in present)
    evidence = {r: f.evidence for r, f in sorted(ranks.items()) if f.evidence is not None}
    scan = RankScan(
        name,
        world,
        dict(sorted(ranks.items())),
        missing,
        dict(sorted(damaged.items())),
        first_bad_rank(evidence),
    )
    return scan.check() if strict else scan


def _check_bounded(name: str, world: int | None, files: list[RankFileScan]) -> None:
    """Every rank is below the world size the readable files record (below
    ``MAX_WORLD_SIZE`` when none records one): a file named ``run.rank2000000000.h5`` beside a
    run is no rank of it, and a gap up to its number is no list of missing ranks."""
    bound = world if world is not None else MAX_WORLD_SIZE
    beyond = {f.rank: f for f in files if f.rank is not None and f.rank >= bound}
    if not beyond:
        return
    first = beyond[min(beyond)]
    more = f" (and {len(beyond) - 1} more such files)" if len(beyond) > 1 else ""
    recorded = (
        f"the world size {world} the run's files record"
        if world is not None
        else f"any world size replay reads ({MAX_WORLD_SIZE})"
    )
    raise RecordingError(
        f"{name}: {first.path} is named rank {first.rank}, beyond {recorded}{more}: it is not a "
        "rank of this run; move it away, or name the run's files (a glob such as "
        "'run.rank[0-9].h5')"
    )


def rank_set(run: str, *, strict: bool = True) -> RankScan | None:
    """The rank set ``run`` names, scanned (and, ``strict``, complete); ``None`` when ``run`` is
    one plain recording. Every command that reads a recording asks this once and passes the
    :class:`RankScan` down."""
    files = resolve_rank_files(run)
    return None if files is None else scan_rank_set(files, strict=strict, name=run)
