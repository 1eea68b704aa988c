"""Skip the stages above a cache for the items it has: the *segment* and its *decider*.

A stage with :attr:`~pipeflow.Traits.memo` (``pf.cache``) remembers what the stages above
it made of each input. Those stages, its *segment*, are the run of one-to-one, in-order
stages right above it (``fetch``, ``map``, an ordered ``parallel_map``, ``collate``): what
they make of an input depends on that input alone, so the input is the output's key (the
dataset index that ``pf.indices`` produced, whatever the shuffle). A stage before the cache
that draws randomness (``random_map``, a stage taking ``epoch``) is refused when the loader is
built (:func:`check`): a cache would freeze its draws.

Each pass wires a segment so (:func:`assemble`, and the runner for a loader's own stages):

- a :class:`Decider` reads the keys, in order, and decides once for each whether the store
  has it; the segment's input is the keys it lacks (:meth:`Decider.misses`), so a read-ahead
  stage in it (a parallel map) runs ahead over misses only;
- :func:`merge` walks the decisions in order: a hit is the stored value, a miss the segment's
  next output (it is one-to-one and in order: that key's value), which it stores.

So the output is the uncached pipeline's, item for item, in the order of ``(seed, epoch)``.
A sample of a stream (``pf.read_tar``'s, ``pf.read_jsonl``'s) is keyed by its shard and its
place in it (``"__url__"``, ``"__index__"``): the reader still reads it, and the stages
after the reader do not run. An item that is a ``list`` (a batch of indices, before a
batched ``fetch``) is decided key by key: the segment gets the list of the missing ones, and
the merge puts the batch back together. A key that is still in flight when it comes again
(a sampler with replacement) waits for its first value instead of being computed twice; in
workers that share a store, the first to miss a key claims it and the others wait for it.

The stores are named by the cache's *slot*, its place in the loader, the same in every
process; a persistent one (``path``) keeps its entries under a digest of its segment.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pipeflow.engine._failure import Failure
from pipeflow.resume._seeds import is_workers

#: A :class:`~pipeflow.Stage` (not imported: ``Pipe.apply`` wires its caches with this module).
Stage = Any

__all__ = [
    "MISSING",
    "Decider",
    "Home",
    "alive",
    "assemble",
    "check",
    "draws",
    "has_memo",
    "merge",
    "on_release",
    "open_store",
    "release",
    "segments",
    "tallies",
]


class _Missing:
    """What a store's ``get`` returns for a key it lacks."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


def one_to_one(stage: Stage) -> bool:
    """Whether *stage* makes one output per input, in order, from that input alone (it
    resumes by skipping as many inputs as outputs)."""
    rule = stage.resume
    return (
        rule.kind == "below"
        and rule.per == "same"
        and not rule.unordered
        and all(stage.length(k) == k for k in (1, 2, 7))
    )


def draws(stage: Stage) -> bool:
    """Whether *stage*'s output can change from epoch to epoch: it has a seed of its own (the
    seed of a parallel stage's workers does not count), or its function, or a stage nested
    in it, takes ``epoch``."""
    if any(not is_workers(owner) for owner, _ in stage.seed_slots()):
        return True
    return any("epoch" in s._wants for s in _nested(stage))


def drawer(stage: Stage) -> str:
    """The name of the stage that draws in *stage*: itself, or one nested in it
    (``"random_map (in parallel_map)"``)."""
    for value in stage._config.values():
        if _is_stage(value):
            for s in value.stages:
                if draws(s):
                    return f"{drawer(s)} (in {stage.name})"
    return str(stage.name)


def _nested(stage: Stage) -> Iterator[Stage]:
    """*stage*, and the stages in its configuration (a parallel map's), recursively."""
    for s in stage.stages:
        yield s
        for value in s._config.values():
            if _is_stage(value):
                yield from _nested(value)


def _is_stage(value: Any) -> bool:
    """Whether *value* is a stage (a nested one, in a parallel map's configuration)."""
    return isinstance(getattr(type(value), "traits", None), property) and hasattr(value, "stages")


def segments(stages: Sequence[Stage]) -> dict[int, int]:
    """For each memo stage of *stages*, by position, where its segment starts.

    Raises:
        ValueError: a stage before a cache draws randomness, or nothing above the cache
            could be skipped (the message names the stage and says where the cache goes).
    """
    out = {}
    for c, stage in enumerate(stages):
        if stage.traits.memo is None:
            continue
        for s in stages[:c]:
            if draws(s) and (one_to_one(s) or any(t.traits.memo for t in _nested(s))):
                raise ValueError(_frozen(stage.name, s))
        j = c
        while j > 0 and one_to_one(stages[j - 1]) and stages[j - 1].traits.memo is None:
            j -= 1
        if j == c:
            above = f"after {stages[c - 1].name}" if c else "first"
            msg = (
                f"{stage.name}: nothing above it to skip ({above}, it would store its own "
                f"inputs); put {stage.name}() right after the stages whose work it keeps, "
                f"such as pf.fetch(dataset) | pf.map(decode) | pf.{stage.name}()"
            )
            raise ValueError(msg)
        out[c] = j
    return out


def _frozen(name: str, random: Stage) -> str:
    who = drawer(random)
    return (
        f"{name}: {who} before it draws new numbers every epoch, and a {name} would "
        f"freeze them (every epoch would see the first epoch's draws); put {name}() before "
        f"{who.split(' ')[0]}: stages after the {name} draw as they would without it"
    )


def check(stages: Sequence[Stage]) -> None:
    """Refuse a loader whose caches cannot be exact (see :func:`segments`), its nested
    stages' (inside a parallel map) included."""
    segments(stages)
    for s in stages:
        for value in s._config.values():
            if _is_stage(value) and any(t.traits.memo for t in _nested(value)):
                check(value.stages)


def has_memo(stages: Sequence[Stage]) -> bool:
    """Whether any of *stages*, or a stage nested in one, is a memo stage."""
    return any(t.traits.memo is not None for s in stages for t in _nested(s))


@dataclass(slots=True)
class _Unit:
    """One input of the segment, decided: its keys, their values (``MISSING`` for those
    the segment makes, ``_WAIT`` for those in flight), and the keys it feeds the segment."""

    keys: list[Any]
    values: list[Any]
    fed: list[int]  # positions of the keys fed to the segment
    batch: bool
    passthrough: Any = MISSING  # an item that is not a key (a failure): out as it came
    elsewhere: list[tuple[int, Any]] | None = None  # (position, input) another worker makes


class _Wait:
    __slots__ = ()


_WAIT: Any = _Wait()
_ELSEWHERE: Any = _Wait()  # a key another worker claimed: its value is waited for


class Decider:
    """Reads the keys of a pass in order and decides once, for each, hit or miss.

    *store* has ``get(key)`` (``MISSING`` when absent) and ``put(key, value)``. With
    *compute* (``compute(input, batch)``: the segment's value for one input, made at once), a
    decider shares its store with other workers' deciders: a key it lacks is claimed first
    (``store.claim``), and a key another worker claimed is waited for (``store.wait``)
    instead of being made twice.
    """

    def __init__(
        self,
        keys: Iterator[Any],
        store: Any,
        name: str = "cache",
        compute: Callable[[Any, bool], Any] | None = None,
    ) -> None:
        self.keys = keys
        self.store = store
        self.name = name
        self.compute = compute
        self.claimed: set[Any] = set()  # keys this decider claimed and has not put yet
        self.queue: deque[_Unit] = deque()  # decided, not merged yet
        self.unfed: deque[Any] = deque()  # inputs for the segment, not read yet
        self.flying: dict[Any, int] = {}  # a key fed to the segment, not merged: how often asked
        self.landed: dict[Any, Any] = {}  # values of flown keys that later units wait for
        self.ended = False
        self.lock = threading.Lock()

    def _decide(self) -> bool:
        """Decide the next key (or list of keys); ``False`` when there are no more."""
        if self.ended:
            return False
        try:
            item = next(self.keys)
        except StopIteration:
            self.ended = True
            return False
        if type(item) is int:  # a dataset index: the common case, decided at once
            return self._one(item, item)
        if isinstance(item, Failure):  # an item that failed above the segment: around it
            self.queue.append(_Unit([], [], [], False, item))
            return True
        if not isinstance(item, list):
            return self._one(identity(item), item)
        items = item  # a batch: decided key by key
        keys = [x if type(x) is int else identity(x) for x in items]
        values: list[Any] = []
        fed: list[int] = []
        elsewhere: list[tuple[int, Any]] = []
        get, flying = self.store.get, self.flying
        for i, k in enumerate(keys):
            try:
                if k in flying:
                    flying[k] += 1
                    values.append(_WAIT)
                    continue
            except TypeError:
                raise TypeError(_unhashable(self.name, k)) from None
            v = get(k)
            if v is MISSING and not self._mine(k):
                elsewhere.append((i, items[i]))
                v = _ELSEWHERE
            elif v is MISSING:
                flying[k] = 1
                fed.append(i)
            values.append(v)
        self.queue.append(_Unit(keys, values, fed, True, MISSING, elsewhere or None))
        if fed:
            self.unfed.append([items[i] for i in fed])
        return True

    def _one(self, key: Any, item: Any) -> bool:
        """Decide one key (of the item *item*)."""
        flying = self.flying
        try:
            again = key in flying
        except TypeError:
            raise TypeError(_unhashable(self.name, key)) from None
        if again:
            flying[key] += 1
            self.queue.append(_Unit([key], [_WAIT], [], False))
            return True
        value = self.store.get(key)
        if value is MISSING and not self._mine(key):
            self.queue.append(_Unit([key], [_ELSEWHERE], [], False, MISSING, [(0, item)]))
        elif value is MISSING:
            flying[key] = 1
            self.queue.append(_Unit([key], [value], [0], False))
            self.unfed.append(item)
        else:
            self.queue.append(_Unit([key], [value], [], False))
        return True

    def _mine(self, key: Any) -> bool:
        """Whether this decider makes *key* (always, unless its store is shared and another
        worker claimed it)."""
        if self.compute is None:
            return True
        if self.store.claim(key):
            self.claimed.add(key)
            return True
        return False

    def stored(self, key: Any) -> None:
        """*key*'s value is in the store (or will not be): its claim goes."""
        if key in self.claimed:
            self.claimed.discard(key)
            self.store.release(key)

    def release_all(self) -> None:
        """The pass ends (or failed): the claims not kept go, so no other worker waits."""
        for key in list(self.claimed):
            self.stored(key)

    def fetch_elsewhere(self, unit: _Unit, tally: list[int]) -> None:
        """Fill the values of *unit*'s keys another worker claimed: its value once stored,
        else (it failed, or died) made here."""
        assert self.compute is not None
        assert unit.elsewhere is not None
        compute = self.compute
        for i, item in unit.elsewhere:
            value, made = self.store.wait(unit.keys[i], lambda x=item: compute(x, unit.batch))
            unit.values[i] = value
            if made:
                tally[0] -= 1
                tally[1] += 1

    def misses(self) -> Iterator[Any]:
        """The segment's input: the keys the store lacks (lists of them, for batches)."""
        while True:
            with self.lock:
                while not self.unfed:
                    if not self._decide():
                        return
                item = self.unfed.popleft()
            yield item

    def next_unit(self) -> _Unit | None:
        """The next decision to merge, or ``None`` at the end of the pass."""
        with self.lock:
            while not self.queue:
                if not self._decide():
                    return None
            return self.queue.popleft()

    def landing(self, key: Any, value: Any) -> None:
        """*key*'s value came out of the segment: keep it for the units waiting for it."""
        with self.lock:
            waiting = self.flying.pop(key, 1) - 1
            if waiting:
                self.landed[key] = (waiting, value)

    def waited(self, key: Any) -> Any:
        """The value a unit waited for (its key was in flight when it was decided)."""
        with self.lock:
            waiting, value = self.landed[key]
            if waiting == 1:
                del self.landed[key]
            else:
                self.landed[key] = (waiting - 1, value)
            return value


def identity(item: Any) -> Any:
    """The key of an input of a segment: the item itself (a dataset index), or, for a sample
    of a stream (a dict with ``"__url__"`` and ``"__index__"``, as the shard readers make),
    its shard and its place there."""
    if type(item) is dict and "__url__" in item and "__index__" in item:
        return (item["__url__"], item["__index__"])
    return item


def _unhashable(name: str, key: Any) -> str:
    return (
        f"{name}: its keys are the items that enter the stages above it (a dataset's indices, "
        f"for pf.fetch; a stream's samples, by their '__url__' and '__index__'), but one is "
        f"a {type(key).__name__}, which can't be a key; put {name}() after stages that read "
        "indices, such as pf.fetch(dataset), or that read a stream's samples"
    )


def merge(decider: Decider, segment: Iterator[Any]) -> Iterator[Any]:
    """The decisions, in order: a hit is the stored value, a miss the segment's next output,
    which goes into the store. The store counts hits, misses and the time the misses took
    (``count(hits, misses, ns)``, told every 256 keys and when the pass ends)."""
    tally = [0, 0, 0]  # hits, misses, the misses' ns: not told the store yet
    count = decider.store.count
    try:
        while True:
            unit = decider.next_unit()
            if unit is None:
                break
            if unit.passthrough is not MISSING:
                yield unit.passthrough
                continue
            if unit.fed:
                out = _fed(decider, unit, segment, tally)
                if out is not None:  # the item failed: out in its place, not stored
                    yield out
                    continue
            else:
                tally[0] += len(unit.keys)
            if unit.elsewhere:
                decider.fetch_elsewhere(unit, tally)
            values = unit.values
            for i, v in enumerate(values):
                if v is _WAIT:
                    values[i] = decider.waited(unit.keys[i])
            yield values if unit.batch else values[0]
            if tally[0] + tally[1] >= 256:
                count(*tally)
                tally[:] = [0, 0, 0]
        for extra in segment:
            del extra
            msg = f"{decider.name}: the stages above it made more items than they were given"
            raise RuntimeError(msg)
    finally:
        decider.release_all()
        if tally[0] or tally[1]:
            count(*tally)


def _fed(decider: Decider, unit: _Unit, segment: Iterator[Any], tally: list[int]) -> Any:
    """Fill *unit*'s misses from the segment's next output, and store them; the output when
    it is a failure (nothing stored), else ``None``."""
    t0 = time.perf_counter_ns()
    try:
        out = next(segment)
    except StopIteration:
        msg = (
            f"{decider.name}: the stages above it made fewer items than they were given "
            "(one of them dropped an item, so no key can be matched to its value)"
        )
        raise RuntimeError(msg) from None
    tally[2] += time.perf_counter_ns() - t0
    tally[0] += len(unit.keys) - len(unit.fed)
    tally[1] += len(unit.fed)
    keys, values = unit.keys, unit.values
    if isinstance(out, Failure):
        for i in unit.fed:
            decider.landing(keys[i], out)
            decider.stored(keys[i])
        return out
    put = decider.store.put
    for i, v in zip(unit.fed, _made(decider.name, unit, out)):
        values[i] = v
        decider.landing(keys[i], v)
        put(keys[i], v)
        decider.stored(keys[i])
    return None


def _made(name: str, unit: _Unit, out: Any) -> Sequence[Any]:
    """The values the segment made for *unit*'s fed keys: for a batch, a list of one sample
    per key (a collated batch, a tuple or a dict would come out changed: refused)."""
    if not unit.batch:
        return (out,)
    n = len(out) if type(out) is list else -1
    if n != len(unit.fed):
        msg = (
            f"{name}: the stages above it made {_what(out, n)} from a batch of "
            f"{len(unit.fed)} keys; a {name} over batches of indices needs one sample per "
            f"key (put {name}() before pf.collate(), and before an ignore_errors that drops "
            "samples from batches)"
        )
        raise ValueError(msg)
    return out  # type: ignore[no-any-return]


def _what(out: Any, n: int) -> str:
    return f"a {type(out).__name__} (not a list of samples)" if n < 0 else f"{n} samples"


def assemble(
    stages: Sequence[Stage],
    upstream: Iterator[Any],
    apply: Callable[[int, Stage, Iterator[Any]], Iterator[Any]],
    store: Callable[[int, int], Any],
    segs: dict[int, int] | None = None,
) -> Iterator[Any]:
    """Chain *stages* over *upstream* with ``apply(i, stage, it)``, each memo stage's
    segment running on the keys its store lacks; ``store(c, j)`` opens the store of the
    memo stage at *c* whose segment starts at *j* (*segs*: :func:`segments` of *stages*,
    when known)."""
    segs = segments(stages) if segs is None else segs
    starts = {j: c for c, j in segs.items()}
    deciders: dict[int, Decider] = {}
    it = upstream
    for i, stage in enumerate(stages):
        if i in starts:
            c = starts[i]
            made = _maker(stages, i, c, apply)
            deciders[c] = Decider(it, store(c, i), stages[c].name, made)
            it = deciders[c].misses()
        it = merge(deciders[i], it) if i in segs else apply(i, stage, it)
    return it


@dataclass(frozen=True)
class Home:
    """Where one loader's caches live, handed to its workers in the pass's facts (under
    ``"memo"``): the owner keeps them in its memory; worker processes share files in
    :attr:`shared`, which goes when the loader closes (or, after a crash, when the next
    loader in any process starts its caches).

    Attributes:
        uid: the loader's caches' name, unique to it.
        pid: the process that owns them (the loader's).
        length: the loader's source's length (part of a persistent cache's identity).
    """

    uid: str
    pid: int
    length: int | None = None

    @staticmethod
    def new(length: int | None) -> Home:
        """A new home for a loader in this process."""
        _sweep()
        return Home(uuid.uuid4().hex[:16], os.getpid(), length)

    def owned(self) -> bool:
        """Whether this process owns the caches (the loader's, and its thread workers')."""
        return os.getpid() == self.pid

    @property
    def shared(self) -> str:
        """The directory of the entries worker processes share, and of their counts."""
        return os.path.join(_shm_base(), f"{_PREFIX}{self.pid}-{self.uid}")


_PREFIX = "pipeflow-cache-"


def _shm_base() -> str:
    """``/dev/shm`` (memory that the processes mapping a file share), else the temporary
    directory."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return tempfile.gettempdir()


def _sweep() -> None:
    """Remove the shared entries of loaders whose process died without closing them (once a
    process)."""
    if _SWEPT:
        return
    _SWEPT.append(True)
    for root in glob.glob(os.path.join(_shm_base(), f"{_PREFIX}*-*")):
        pid = root.rsplit("-", 2)[-2]
        if pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(root, ignore_errors=True)


_SWEPT: list[bool] = []


def alive(pid: int) -> bool:
    """Whether process *pid* runs (another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


#: What releasing a home does, by its uid: registered by the stores as they open (owner only).
_RELEASE: dict[str, list[Callable[[], None]]] = {}


def on_release(home: Home, fn: Callable[[], None]) -> None:
    """Call *fn* when the loader of *home* closes (in the owner process only)."""
    if home.owned():
        _RELEASE.setdefault(home.uid, []).append(fn)


def release(home: Home) -> None:
    """Drop what the caches of *home* hold, and their shared files (the loader closes)."""
    for fn in _RELEASE.pop(home.uid, []):
        fn()
    if home.owned():
        shutil.rmtree(home.shared, ignore_errors=True)


def open_store(stage: Stage, segment: Sequence[Stage], home: Home | None, slot: str) -> Any:
    """The store of memo stage *stage*, whose segment is *segment*, for this process.

    *slot* names the cache in its loader, the same in every process: ``"3"`` for the loader's
    stage 3, ``"2.1"`` for stage 1 inside the loader's stage 2 (a parallel map)."""
    memo = stage.traits.memo
    assert memo is not None
    home = home if home is not None else Home.new(None)
    return memo(segment=tuple(segment), home=home, slot=slot, **stage._config)


def tallies(stages: Sequence[Stage], home: Home, fused: int) -> dict[int, tuple[int, ...]]:
    """The caches' counts (hits, misses, the misses' nanoseconds, bytes kept), in every
    process, by the position of the stage in *stages* (a loader's running stages, after the
    *fused* ones its plan computes) that holds them (the cache, or the parallel map it runs
    in)."""
    out: dict[int, tuple[int, ...]] = {}
    top = segments(stages)
    for i, s in enumerate(stages):
        at = i + fused
        found = [open_store(s, stages[top[i] : i], home, f"{at}").tally()] if i in top else []
        for inner in _nested_lists(s):
            for c, j in segments(inner).items():
                found.append(open_store(inner[c], inner[j:c], home, f"{at}.{c}").tally())
        if found:
            out[i] = tuple(sum(col) for col in zip(*found))
    return out


def _maker(
    stages: Sequence[Stage],
    j: int,
    c: int,
    apply: Callable[[int, Stage, Iterator[Any]], Iterator[Any]],
) -> Callable[[Any, bool], Any]:
    """``make(input, batch)``: the value of the segment ``stages[j:c]`` for one input, run at
    once (a key another worker claimed, and then failed or died before it stored it)."""

    def make(item: Any, batch: bool) -> Any:
        it: Iterator[Any] = iter(([item],) if batch else (item,))
        for k in range(j, c):
            it = apply(k, stages[k], it)
        out = next(it)
        if isinstance(out, Failure):
            raise out.error
        return out[0] if batch else out

    return make


def _nested_lists(stage: Stage) -> Iterator[tuple[Stage, ...]]:
    """The lists of stages nested in *stage*'s configuration (a parallel map's), deep."""
    for value in stage._config.values():
        if _is_stage(value):
            yield value.stages
            for s in value.stages:
                yield from _nested_lists(s)
