"""``shards``: a source of shard names, shuffled per epoch and split across ranks and workers.

A dataset at web scale is thousands of files (tar, JSON lines, Parquet) on a disk or in
object storage. :func:`shards` lists them once, when it is built, and each pass yields this
reader's share of them as :class:`Shard` records for a reader stage
(:func:`~pipeflow.read_tar`, :func:`~pipeflow.read_jsonl`, :func:`~pipeflow.read_parquet`):

1. the epoch's order: a shuffle of the list from ``(seed, epoch)`` (the stream
   :data:`~pipeflow._random.SHARDS`), the same on every rank and worker;
2. this rank's share (see :func:`split`): whole shards dealt in turn, or, when the shards'
   sizes are known, an equal run of the epoch's samples, so that every rank makes the same
   number of batches and DDP never waits on a rank that ran out;
3. inside a :func:`~pipeflow.parallel_source` worker, this worker's share of the rank's:
   its pieces ``worker, worker + workers, ...``.

So every shard (every sample, with sizes) is read once per epoch by the whole job, and the
order is a function of the seed and the epoch alone.
"""

from __future__ import annotations

import glob as _glob
import hashlib
import os
import random
import re
from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from pipeflow import _checks
from pipeflow._random import SHARDS, check_seed, derive, fresh_seed
from pipeflow.engine._context import Context
from pipeflow.engine._stage import Source
from pipeflow.engine.loader import Loader
from pipeflow.resume.state import Rule
from pipeflow.stages.distributed import rank_and_world_size
from pipeflow.worker_info import get_worker_info, in_replica

__all__ = ["Shard", "expand", "relative_names", "root_of", "shards", "split"]

_BALANCES = ("pad", "drop", "shards")
_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


class Shard(NamedTuple):
    """One piece of one shard, as :func:`shards` yields it to a reader.

    Attributes:
        url: the shard's path or URL.
        number: the shard's number in the list :func:`shards` was given (stable across
            epochs).
        start: the first sample of the shard to read (0 unless a rank's share begins inside
            the shard).
        stop: the sample to stop before, or ``None``: to the end of the shard.
        size: the shard's number of samples as the user declared it (``sizes=``), or
            ``None``; a reader checks the shard against it.

    Examples:
        >>> Shard("data/train-0.tar", 0)
        Shard(url='data/train-0.tar', number=0, start=0, stop=None, size=None)
    """

    url: str
    number: int
    start: int = 0
    stop: int | None = None
    size: int | None = None


# -- listing ----------------------------------------------------------------------------------
def _braces(pattern: str) -> list[str]:
    """Expand ``{a..b}`` (zero-padded as written) and ``{x,y}``, left to right."""
    m = _BRACE.search(pattern)
    if m is None:
        return [pattern]
    head, body, tail = pattern[: m.start()], m.group(1), pattern[m.end() :]
    r = _RANGE.match(body)
    if r is not None:
        a, b = int(r.group(1)), int(r.group(2))
        width = len(r.group(1)) if r.group(1).startswith("0") else 0
        step = 1 if b >= a else -1
        options = [f"{i:0{width}d}" for i in range(a, b + step, step)]
    else:
        options = body.split(",")
    return [x for o in options for x in _braces(head + o + tail)]


def _is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def _local_path(url: str) -> str:
    return url[len("file://") :] if url.startswith("file://") else url


def _glob_one(pattern: str, storage_options: Mapping[str, Any], timeout: float) -> list[str]:
    if _is_local(pattern):
        prefix = "file://" if pattern.startswith("file://") else ""
        return [prefix + p for p in sorted(_glob.glob(_local_path(pattern)))]
    from pipeflow.errors import _add_note
    from pipeflow.sources.readers._remote import credentials_note, import_file_system, refused
    from pipeflow.sources.readers._storage import call_within

    import_file_system(pattern, "shards: pattern")
    import fsspec

    fs, path = fsspec.core.url_to_fs(pattern, **storage_options)
    protocol = pattern.split("://", 1)[0]
    try:
        found = sorted(call_within(fs, "glob", timeout, path))
    except TimeoutError as e:
        msg = (
            f"shards: listing {pattern!r} got no answer in {timeout:g} s: pass a larger "
            "timeout= for a slow store or a long listing, or list the shards by name"
        )
        raise TimeoutError(msg) from e
    except Exception as e:
        if refused(e):
            _add_note(e, credentials_note(f"shards: listing {pattern!r}", pattern, e))
        raise
    return [p if "://" in p else f"{protocol}://{p}" for p in found]


def expand(
    pattern: str, storage_options: Mapping[str, Any] | None = None, *, timeout: float = 60.0
) -> list[str]:
    """The shard names a pattern stands for: braces expanded, then globs matched (sorted),
    on the local disk or through fsspec for a URL (each listing waited on at most *timeout*
    seconds: a ``TimeoutError`` after).

    Examples:
        >>> expand("s3://bucket/train-{000..002}.tar")
        ['s3://bucket/train-000.tar', 's3://bucket/train-001.tar', 's3://bucket/train-002.tar']
        >>> expand("data/{train,val}-{1..2}.jsonl")
        ['data/train-1.jsonl', 'data/train-2.jsonl', 'data/val-1.jsonl', 'data/val-2.jsonl']
    """
    out: list[str] = []
    for name in _braces(pattern):
        if any(c in name.split("://", 1)[-1] for c in "*?["):
            out.extend(_glob_one(name, storage_options or {}, timeout))
        else:
            out.append(name)
    return out


# -- the split --------------------------------------------------------------------------------
def split(
    order: Sequence[int],
    sizes: Sequence[int] | None,
    rank: int,
    world_size: int,
    balance: str,
) -> list[tuple[int, int, int | None]]:
    """This rank's pieces of an epoch whose shards come in *order*: ``(shard, start, stop)``.

    - ``"shards"`` (or no *sizes*): whole shards, dealt in turn: ``order[rank::world_size]``.
    - ``"pad"`` / ``"drop"`` (with *sizes*): the epoch's samples, shard after shard in
      *order*, are cut into *world_size* equal runs, and the rank reads run *rank*: every
      rank reads ``ceil(N / world_size)`` samples, the last runs wrapping around to the
      epoch's first samples (``"pad"``, as ``DistributedSampler`` pads), or
      ``N // world_size``, leaving out the epoch's last ``N % world_size`` samples
      (``"drop"``). A shard cut between two runs is read in part by each rank.

    Examples:
        >>> split([2, 0, 1], None, 0, 2, "pad")
        [(2, 0, None), (1, 0, None)]
        >>> split([0, 1, 2], [3, 3, 1], 1, 2, "pad")  # 7 samples: 4 each, one padded
        [(1, 1, 3), (2, 0, 1), (0, 0, 1)]
        >>> split([0, 1, 2], [3, 3, 1], 1, 2, "drop")  # 3 each, the last sample left out
        [(1, 0, 3)]
    """
    if sizes is None or balance == "shards":
        return [(i, 0, None) for i in order[rank::world_size]]
    starts = [0]
    for i in order:
        starts.append(starts[-1] + sizes[i])
    total = starts[-1]
    each = -(-total // world_size) if balance == "pad" else total // world_size
    out: list[tuple[int, int, int | None]] = []
    p, hi = rank * each, (rank + 1) * each
    while p < hi and total:
        q = p % total
        j = bisect_right(starts, q) - 1  # the (non-empty) shard holding sample q
        first = q - starts[j]
        take = min(sizes[order[j]] - first, hi - p)
        out.append((order[j], first, first + take))
        p += take
    return out


def _identity(source: _Shards) -> list[str]:
    """What a state compares: the shards' names relative to their folder or bucket (see
    :func:`root_of`), so a state resumes over the same shards moved elsewhere; the seed only
    when the order depends on it."""
    return [source._describe("")]


class _Shards(Source[Shard]):
    name = "shards"
    #: A pass starts at any piece; a state compares the shards by their relative names.
    resume = Rule.seek(identity=_identity)

    def __init__(self, urls: tuple[str, ...], sizes: tuple[int, ...] | None, **config: Any):
        self.urls = urls
        self.sizes = sizes
        self.config = config  # seed, shuffle, rank, world_size, balance

    # -- what a pass yields -------------------------------------------------------------------
    def _share(self) -> tuple[int, int, int, int]:
        """``(rank, world_size, worker, workers)`` for the pass starting now."""
        rank, world = self.config["rank"], self.config["world_size"]
        auto_rank, auto_world = rank_and_world_size() if None in (rank, world) else (0, 1)
        r = auto_rank if rank is None else rank
        w = auto_world if world is None else world
        if not 0 <= r < w:
            msg = f"shards: rank {r} is not below world_size {w}"
            raise ValueError(msg)
        info = get_worker_info()
        if info is not None and in_replica():  # this worker's share of the rank's
            return r, w, info.id, info.num_workers
        return r, w, 0, 1

    def pieces(self, epoch: int) -> list[Shard]:
        """This reader's pieces of epoch *epoch*, in order."""
        r, w, k, m = self._share()
        balance = self.config["balance"]
        if w > 1 and self.sizes is None and balance != "shards":
            raise ValueError(_needs_sizes(w))
        order = list(range(len(self.urls)))
        if self.config["shuffle"]:
            random.Random(derive(self.config["seed"], SHARDS, epoch)).shuffle(order)
        mine = split(order, self.sizes, r, w, balance)[k::m]
        sizes = self.sizes
        return [
            Shard(self.urls[i], i, a, b, None if sizes is None else sizes[i]) for i, a, b in mine
        ]

    def iterate(self, context: Context) -> Iterator[Shard]:
        pieces = self.pieces(context.epoch)
        return iter(pieces[context.start :])

    def length(self) -> int | None:
        """The pieces per epoch, where the order does not change how many (a run of samples
        cut from shuffled shards may span more or fewer of them)."""
        c = self.config
        uneven = self.sizes is not None and c["shuffle"] and c["balance"] != "shards"
        if uneven and self._share()[1] > 1:
            return None
        try:
            return len(self.pieces(0))
        except ValueError:
            return None

    # -- what it is ---------------------------------------------------------------------------
    def describe(self) -> str:
        root = root_of(self.urls)
        return self._describe(f" under {root!r}" if root else "")

    def _describe(self, where: str) -> str:
        c = self.config
        names = relative_names(self.urls)
        digest = hashlib.sha1("\n".join(names).encode()).hexdigest()[:8]
        if not names:
            what = "no shards"
        else:
            listed = f"{names[0]!r}" + (f" … {names[-1]!r}" if len(names) > 1 else "")
            what = f"{len(names)} shards{where}: {listed} #{digest}"
        if self.sizes is not None:
            sized = hashlib.sha1(repr(self.sizes).encode()).hexdigest()[:8]
            what += f", sizes={sum(self.sizes)} samples #{sized}"
        r, w = rank_and_world_size() if None in (c["rank"], c["world_size"]) else (0, 1)
        rank = f"{c['rank']}" if c["rank"] is not None else f"None (now {r})"
        world = f"{c['world_size']}" if c["world_size"] is not None else f"None (now {w})"
        seed = f"seed={c['seed']!r}, " if c["shuffle"] else ""
        return (
            f"shards({what}, {seed}shuffle={c['shuffle']}, "
            f"balance={c['balance']!r}, rank={rank}, world_size={world})"
        )

    def seed_slots(self) -> list[tuple[str, int]]:
        return [("shards", self.config["seed"])] if self.config["shuffle"] else []

    def with_seeds(self, seeds: Iterator[int]) -> _Shards:
        if not self.config["shuffle"]:
            return self
        return _Shards(self.urls, self.sizes, **{**self.config, "seed": next(seeds)})

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.urls, self.sizes, self.config))


def _rebuild(urls: tuple[str, ...], sizes: Any, config: dict[str, Any]) -> _Shards:
    return _Shards(urls, sizes, **config)


def root_of(urls: Sequence[str]) -> str:
    """The folder or bucket prefix all *urls* share, up to and with its last ``/`` (``""``
    when they share none): what a state leaves out of the shards' names.

    Examples:
        >>> root_of(["/data/v1/train-0.tar", "/data/v1/train-1.tar"])
        '/data/v1/'
        >>> root_of(["s3://b/x/a.tar", "s3://b/y/c.tar"])
        's3://b/'
        >>> root_of(["a.tar"])
        ''
    """
    if not urls:
        return ""
    first, last = min(urls), max(urls)
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    return first[: first.rfind("/", 0, n) + 1]


def relative_names(urls: Sequence[str]) -> list[str]:
    """*urls* without their common :func:`root_of`.

    Examples:
        >>> relative_names(["/data/v1/train-0.tar", "/data/v1/val/0.tar"])
        ['train-0.tar', 'val/0.tar']
    """
    cut = len(root_of(urls))
    return [u[cut:] for u in urls]


def _import_file_systems(urls: list[str]) -> None:
    """Import the fsspec file systems of the remote shards (s3fs for ``s3://``...) here,
    once: forked workers then start with them, instead of each importing them again for
    every pass (about a second for s3fs and aiobotocore on a 2-core machine). One that is
    not installed is an :class:`ImportError` now, naming the package and how to install
    it, not at the first ``next()``. A protocol fsspec does not know is left to the reader,
    which names the shard it could not open."""
    first: dict[str, str] = {}  # a URL of each remote protocol
    for u in urls:
        if not _is_local(u):
            first.setdefault(u.split("://", 1)[0], u)
    if not first:
        return
    from pipeflow.sources.readers._remote import import_file_system

    for protocol in sorted(first):
        import_file_system(first[protocol], "shards: shard")


def _check_local(pattern: str, names: list[str]) -> None:
    """Refuse a pattern whose local names do not all exist, naming the first missing and
    how many are (a listing per folder: cheap on a local disk)."""
    folders: dict[str, set[str]] = {}
    missing = []
    for name in names:
        if not _is_local(name):
            continue
        folder, base = os.path.split(_local_path(name))
        if folder not in folders:
            try:
                folders[folder] = set(os.listdir(folder or "."))
            except OSError:
                folders[folder] = set()
        if base not in folders[folder]:
            missing.append(name)
    if missing:
        msg = (
            f"shards: {missing[0]!r} does not exist ({len(missing)} of the {len(names)} "
            f"shards {pattern!r} names are missing)"
        )
        raise ValueError(msg)


def _needs_sizes(world: int) -> str:
    return (
        f"shards: balance='pad' or 'drop' gives each of the {world} ranks the same number of "
        "samples, which needs the shards' sizes: pass sizes= (each shard's number of "
        "samples), or balance='shards' to deal whole shards (ranks may then get different "
        "numbers of samples, and a DDP loop waits forever on the rank that runs out first "
        "unless it joins: torch.distributed.algorithms.Join)"
    )


def _sizes(urls: list[str], sizes: Any) -> tuple[int, ...] | None:
    if sizes is None:
        return None
    if isinstance(sizes, Mapping):
        missing = [u for u in urls if u not in sizes]
        if missing:
            msg = f"shards: sizes has no size for {missing[0]!r} ({len(missing)} missing)"
            raise ValueError(msg)
        values = [sizes[u] for u in urls]
    elif isinstance(sizes, Sequence) and not isinstance(sizes, str):
        if len(sizes) != len(urls):
            msg = f"shards: sizes must give one size per shard ({len(urls)}; got {len(sizes)})"
            raise ValueError(msg)
        values = list(sizes)
    else:
        msg = (
            "shards: sizes must be a list of sizes or a mapping from shard to size "
            f"(got {type(sizes).__name__})"
        )
        raise TypeError(msg)
    return tuple(_checks.integer("shards", "sizes[...]", v, low=0) for v in values)


def _listed(urls: Any, storage_options: Any, timeout: Any) -> list[str]:
    """The shard names *urls* stands for, checked (see :func:`shards`)."""
    from pipeflow.sources.readers._remote import check_timeout

    timeout = check_timeout("shards", timeout)
    if storage_options is not None and not isinstance(storage_options, Mapping):
        msg = f"shards: storage_options must be a mapping (got {type(storage_options).__name__})"
        raise TypeError(msg)
    if isinstance(urls, str):
        listed = expand(urls, storage_options, timeout=timeout)
        if not listed:
            msg = f"shards: no shard matches {urls!r}"
            raise ValueError(msg)
        _check_local(urls, listed)
    elif isinstance(urls, Sequence) and all(isinstance(u, str) for u in urls):
        listed = list(urls)
    else:
        msg = f"shards: urls must be a pattern or a list of names (got {type(urls).__name__})"
        raise TypeError(msg)
    if len(set(listed)) != len(listed):
        dup = next(u for u in listed if listed.count(u) > 1)
        msg = f"shards: {dup!r} is listed twice: its samples would be read twice an epoch"
        raise ValueError(msg)
    return listed


def shards(
    urls: str | Sequence[str],
    *,
    seed: int | None = None,
    shuffle: bool = True,
    rank: int | None = None,
    world_size: int | None = None,
    sizes: Sequence[int] | Mapping[str, int] | None = None,
    balance: str = "pad",
    storage_options: Mapping[str, Any] | None = None,
    timeout: float = 60.0,
) -> Loader[Shard]:
    """The shards of a sharded dataset, shuffled per epoch and split across ranks and
    workers: every shard is read once per epoch by the whole job.

    Put a reader after it (:func:`~pipeflow.read_tar`, :func:`~pipeflow.read_jsonl`,
    :func:`~pipeflow.read_parquet`), and the whole inside :func:`~pipeflow.parallel_source`
    for workers: each worker then reads its own share of its rank's shards.

    Args:
        urls: a list of paths or URLs, or one pattern: braces (``"train-{000000..004095}.tar"``,
            ``"{train,val}.jsonl"``) and globs (``"data/*.tar"``), on the local disk or any
            fsspec URL (``file://``, ``s3://``, ``gs://``, ``http(s)://``; a glob needs a
            file system that lists). Listed once, when the source is built.
        seed: the shuffle's seed; ``None`` draws one (it travels in a state).
        shuffle: shuffle the shards every epoch, from ``(seed, epoch)``.
        rank: this rank; ``None`` asks ``torch.distributed`` (else ``RANK``, else 0) when
            each pass starts.
        world_size: the number of ranks; ``None`` asks ``torch.distributed`` (else
            ``WORLD_SIZE``, else 1) when each pass starts.
        sizes: each shard's number of samples (a list in the order of *urls*, or a mapping
            from name to size), when known: with it every rank can be given the same number
            of samples.
        balance: how ranks are kept even, so that no rank runs out of batches before the
            others (DDP would wait for it forever): ``"pad"`` (every rank reads
            ``ceil(N / world_size)`` samples, the last ranks reading the epoch's first samples
            again), ``"drop"`` (every rank reads ``N // world_size`` samples, the epoch's last
            ``N % world_size`` left out), both needing *sizes* when there are several ranks;
            or ``"shards"``: whole shards dealt in turn, uneven when the shards are (pair it
            with ``torch.distributed.algorithms.Join``).
        storage_options: options for fsspec's file system, to match a glob.
        timeout: seconds the listing of a glob pattern through fsspec may take (the whole
            listing: a bucket of millions of objects may need more).

    Raises:
        TypeError, ValueError: for bad arguments, a pattern that matches nothing, a pattern
            whose local names do not all exist, sizes that do not match the shards, or
            several ranks with ``"pad"`` / ``"drop"`` and no sizes.
        ImportError: for a URL whose file system's package is not installed (s3fs for
            ``s3://``, aiohttp for ``http(s)://``: ``pip install 'pipeflow[stream]'``;
            gcsfs for ``gs://``, adlfs for ``az://``), naming it.
        TimeoutError: for a listing that takes longer than *timeout*.

    Examples:
        >>> import pipeflow as pf
        >>> names = [f"shard-{i}.tar" for i in range(5)]
        >>> [s.url for s in pf.shards(names, shuffle=False, rank=1, world_size=2, balance="shards")]
        ['shard-1.tar', 'shard-3.tar']
        >>> loader = pf.shards(names, seed=0)
        >>> sorted(s.url for s in loader) == names
        True
    """
    listed = _listed(urls, storage_options, timeout)
    _checks.boolean("shards", "shuffle", shuffle)
    seed = fresh_seed() if seed is None else check_seed("shards", seed)
    rank = _checks.optional_integer("shards", "rank", rank, low=0)
    world_size = _checks.optional_integer("shards", "world_size", world_size, low=1)
    if rank is not None and world_size is not None and rank >= world_size:
        msg = f"shards: rank must be below world_size (got rank={rank}, world_size={world_size})"
        raise ValueError(msg)
    _checks.one_of("shards", "balance", balance, _BALANCES)
    checked = _sizes(listed, sizes)
    _import_file_systems(listed)
    if world_size is not None and world_size > 1 and checked is None and balance != "shards":
        raise ValueError(_needs_sizes(world_size))
    config = {
        "seed": seed,
        "shuffle": shuffle,
        "rank": rank,
        "world_size": world_size,
        "balance": balance,
    }
    return Loader(_Shards(tuple(listed), checked, **config))
