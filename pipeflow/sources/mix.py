"""``mix``: several loaders interleaved by weight, deterministically, resumably.

Which loader gives the item at each position of an epoch is drawn from ``(seed, epoch,
position)`` alone (the stream :data:`~pipeflow._random.MIX`, a counter-based draw: no
generator state to save), among the loaders still in play, by their weights. Each loader
runs its own passes; a state holds, for each, where its pass stands (its own
:meth:`~pipeflow.Loader.pass_record`) as of the consumer's position, so a resumed mix resumes
each loader exactly, reading nothing again.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from pipeflow import _checks
from pipeflow._random import MIX, check_seed, derive, fresh_seed
from pipeflow.engine._context import Context, Hooks
from pipeflow.engine._stage import Source
from pipeflow.engine.loader import Loader
from pipeflow.resume._check import check_pass_record
from pipeflow.resume.state import (
    Each,
    Form,
    Int,
    Progress,
    Record,
    Rule,
    Value,
    conform,
    flag,
    flat_index,
    light,
    through,
)

__all__ = ["mix"]

_STOPS = ("first", "all", "cycle")
_MASK64 = (1 << 64) - 1


def _uniform(key: int, position: int) -> float:
    """A number in [0, 1) from *key* and *position* (splitmix64)."""
    z = (key + (position + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return ((z ^ (z >> 31)) >> 11) / float(1 << 53)


class _Record(Record):
    """A mix's pass: which loader gave each output, and each loader's passes (to read its
    record at any count of its outputs).

    A consumer may stand behind the mix (a prefetching ``parallel_map``, a buffer shuffle
    after it): each loader's record is read from the pass that gave the consumer's items, at
    the count of its items the consumer's position covers, never from where the mix read
    ahead to (a loader's pass it already ran to its end, or a newer one a ``"cycle"``
    started)."""

    __slots__ = (
        "base",
        "consumer",
        "counts",
        "ended",
        "ends",
        "finished",
        "made",
        "passes",
        "runs",
        "saved",
        "source",
        "start",
    )

    @classmethod
    def check(
        cls, source: Any, record: Any, where: str, consumed: int | None, total: int | None
    ) -> dict[str, Any]:
        """Refuse a record that :attr:`FORM` does not allow for *source* (a mix), or whose
        loaders' pass records their loaders could not have made (:func:`_check_loaders`);
        *consumed* is the mix's outputs the state's position took."""
        mix: _Mix = source
        bounds = {
            "consumed": consumed or 0,
            "n": len(mix.loaders),
            "sizes": [_size(x) for x in mix.loaders],
            "stop": mix.stop,
        }
        checked = conform(_FORM, record, where, bounds)
        _check_loaders(mix, checked, where)
        return dict(record)

    def __init__(self, source: _Mix, saved: dict[str, Any] | None, start: int) -> None:
        n = len(source.loaders)
        self.source, self.start = source, start
        base = saved or {"counts": [0] * n, "ended": [False] * n, "cycles": [0] * n}
        self.counts = list(base["counts"])  # outputs of each loader's current pass, consumed
        self.ended = list(base["ended"])
        self.passes = list(base.get("cycles", [0] * n))
        self.base = (list(self.counts), list(self.ended), list(self.passes))
        self.saved = list(base.get("loaders", [None] * n))  # where each stood at the start
        self.made: list[tuple[int, int, int]] = []  # per output: (loader, its count, pass)
        self.ends: list[tuple[int, int]] = []  # (outputs made before, loader) as one ran out
        self.runs: dict[tuple[int, int], Progress] = {}  # by (loader, pass): its pass
        self.finished = False  # the mix ran to its end (it makes no more outputs)
        self.consumer: Callable[[], int | None] | None = None

    def watch(self, consumed: Callable[[], int | None]) -> None:
        """*consumed()* tells how many of this pass's outputs the mix's consumer has taken
        (``None``: it can't be told): the loaders' records that fold what their consumer
        had (a parallel stage's workers' states) fold what the mix's consumer had."""
        self.consumer = consumed

    def started(self, i: int, loader: Loader[Any]) -> None:
        """Loader *i* started its pass ``passes[i]`` (``iter()`` was just called): its
        records that fold what their consumer took are told what the mix's consumer took
        (the pass told them what the mix read, which may be ahead of it)."""
        progress = loader._progress  # the pass iter() just started
        if progress is None:
            return
        cycle = self.passes[i]
        self.runs[(i, cycle)] = progress
        planned = loader.plan()
        watched = [(progress.source, planned.stages)]
        watched += [(r, loader.stages[at + 1 :]) for at, r in progress.deliveries.items()]
        for record, later in watched:
            if record is not None:
                record.watch(self._consumed(i, cycle, progress, later))

    def _consumed(
        self, i: int, cycle: int, progress: Progress, later: Sequence[Any]
    ) -> Callable[[], int | None]:
        """How many outputs of the stage before *later* in loader *i*'s pass *cycle* the
        mix's consumer has taken (``None``: it can't be told)."""

        def consumed() -> int | None:
            taken = self.consumer() if self.consumer is not None else None
            if taken is None:
                return None
            return through(later, self._count(i, cycle, progress, taken) - progress.start)

        return consumed

    def _count(self, i: int, cycle: int, progress: Progress, taken: int) -> int:
        """Loader *i*'s outputs of its epoch in its pass *cycle* among the first *taken*
        outputs of this mix's pass."""
        for j in range(min(taken, len(self.made)) - 1, -1, -1):
            loader, count, at = self.made[j]
            if loader == i:
                if at == cycle:
                    return count
                if at > cycle:  # the consumer is past that pass: it took all of it
                    return progress.start + progress.delivered
                return progress.start  # it has not reached that pass
        if self.base[2][i] == cycle:
            return int(self.base[0][i])
        return progress.start if self.base[2][i] < cycle else progress.start + progress.delivered

    def after(self, needed: int) -> dict[str, Any]:
        """The record once the consumer took *needed* of the epoch's items.

        *needed* may lie past the last output once the mix ended: a ``batch`` after it
        counts its last, short batch as a full one. The rest of the epoch is then empty:
        every loader is out of play."""
        n = len(self.source.loaders)
        counts, ended, passes = list(self.base[0]), list(self.base[1]), list(self.base[2])
        made = self.made[: max(needed - self.start, 0)]
        for i, count, cycle in made:
            counts[i], passes[i] = count, cycle
        for at, i in self.ends:  # (a loader found out as it ran out is drawn again alike)
            if at <= needed:
                ended[i] = True
        if self.finished and needed > self.start + len(made):
            ended = [True] * n
        for key in [k for k in self.runs if k[1] < passes[k[0]]]:
            del self.runs[key]  # passes the consumer is past (its position only grows)
        loaders: list[dict[str, Any] | None] = []
        for i, loader in enumerate(self.source.loaders):
            if ended[i]:
                loaders.append(None)
                continue
            run = self.runs.get((i, passes[i]))
            if run is None:  # not started yet in this pass: where the state said it stood
                loaders.append(copy.deepcopy(self.saved[i]) or {"position": counts[i]})
                continue
            record = _pass_record(loader, run, counts[i])
            loaders.append(record if record is not None else {"position": counts[i]})
        return {"counts": counts, "ended": ended, "cycles": passes, "loaders": loaders}


def _pass_record(loader: Loader[Any], progress: Progress, count: int) -> dict[str, Any] | None:
    """Where *loader*'s pass *progress* stood after *count* of its epoch's outputs, as
    :meth:`~pipeflow.Loader.pass_record` says (``None``: its position says it all), also
    once that pass ran to its end or a newer one started."""
    view = copy.copy(progress)
    view.done = False
    view.delivered = count - progress.start
    return light(loader.source, loader.stages, view)


def _first(k: Mapping[str, Any], bad: Callable[[Mapping[str, Any], int], bool]) -> int | None:
    """The first loader *i* for which ``bad(k, i)`` holds, else ``None``."""
    return next((i for i in range(k["n"]) if bad(k, i)), None)


def _unsaid(k: Mapping[str, Any], i: int) -> bool:  # where loader i stands is missing
    return k["loaders"][i] is None and not k["ended"][i]


def _said_ended(k: Mapping[str, Any], i: int) -> bool:  # an ended loader's is None
    return k["loaders"][i] is not None and k["ended"][i]


def _overcounted(k: Mapping[str, Any]) -> bool:
    """Every output is one loader's, in its current pass or in one it ended (at least one
    output each: an empty loader is not started again); once every loader is out of play the
    position may lie past the last output (a batch after the mix counts its last, short batch
    as a full one)."""
    made, ended_passes, position = sum(k["counts"]), sum(k["cycles"]), k["consumed"]
    return made + ended_passes > position or (
        made != position and not (ended_passes or all(k["ended"]))
    )


def _left_early(k: Mapping[str, Any], i: int) -> bool:  # "cycle": only an empty one leaves
    return bool(k["ended"][i] and (k["counts"][i] or k["cycles"][i]) and not all(k["ended"]))


def _sized_wrong(k: Mapping[str, Any], i: int) -> bool:
    size, ended, count = k["sizes"][i], k["ended"][i], k["counts"][i]
    if size is None:  # only known by running it
        return False
    if k["stop"] == "cycle" and ended and size and not all(k["ended"]):
        return True  # an ended loader in a cycle is an empty one
    return bool(count > size or (k["stop"] == "all" and ended and count != size))


def _sized_says(k: Mapping[str, Any]) -> str:
    i = _first(k, _sized_wrong)
    assert i is not None
    size, count = k["sizes"][i], k["counts"][i]
    if k["stop"] == "cycle" and k["ended"][i] and size and not all(k["ended"]):
        why = f"loader {i} ended, and it is not empty ({size} items per pass)"
    else:
        why = f"loader {i} has {size} items per pass, and "
        why += f"{'ended after' if k['ended'][i] else 'gave'} {count}"
    return f"{k['where']}: {why}, with stop={k['stop']!r}"


#: A mix's record: per loader, the count of its current pass's items consumed, whether it
#: ended, how many passes of it ended (``"cycle"``), and where its pass stands (its own pass
#: record, ``None`` once it ended); they add up to the mix's position, and agree with the
#: mix's *stop* rule and its loaders' lengths where known (a record with every loader ended is
#: the mix's end: any counts its passes allow). Checked with the bounds ``n`` (how
#: many loaders), ``sizes`` (each one's length, ``None`` where unknown) and ``stop``.
_FORM = Form(
    {
        "counts": Each(Int(0), "n"),
        "ended": Each(Value(flag), "n"),
        "cycles": Each(Int(0), "n"),
        "loaders": Each(Value(), "n"),
    },
    invariants=(
        (
            lambda k: _first(k, _unsaid) is None,
            lambda k: (
                f"{k['where']}['loaders'][{(i := _first(k, _unsaid))}] is None, but loader "
                f"{i} has not ended ({k['where']}['ended'][{i}] is False): its "
                f"{k['counts'][i]} items consumed would be read again"
            ),
        ),
        (
            lambda k: _first(k, _said_ended) is None,
            lambda k: (
                f"{k['where']}['loaders'][{(i := _first(k, _said_ended))}] holds where loader "
                f"{i} stands, but {k['where']}['ended'][{i}] says it ended (an ended loader's "
                "is None)"
            ),
        ),
        (
            lambda k: not _overcounted(k),
            lambda k: (
                f"{k['where']} counts {sum(k['counts'])} items from its loaders' passes in "
                f"play and {sum(k['cycles'])} passes ended, and the position says "
                f"{k['consumed']} items were consumed"
            ),
        ),
        (
            lambda k: k["stop"] == "cycle" or not any(k["cycles"]),
            lambda k: (
                f"{k['where']}: {k['where']}['cycles'] is {k['cycles']}: no loader starts "
                f"again, with stop={k['stop']!r}"
            ),
        ),
        (
            lambda k: k["stop"] != "first" or not any(k["ended"]) or all(k["ended"]),
            lambda k: (
                f"{k['where']}: {k['where']}['ended'] is {k['ended']}: the mix ends as the "
                f"first loader runs out, with stop={k['stop']!r}"
            ),
        ),
        (
            lambda k: k["stop"] != "cycle" or _first(k, _left_early) is None,
            lambda k: (
                f"{k['where']}: loader {_first(k, _left_early)} ended: only an empty loader "
                f"leaves the mix, with stop={k['stop']!r}"
            ),
        ),
        (lambda k: _first(k, _sized_wrong) is None, _sized_says),
    ),
)


def _check_loaders(mix: _Mix, record: dict[str, Any], where: str) -> None:
    """Refuse a (conformed) record whose loaders' pass records their loaders could not have
    made, or whose positions are not the counts of their items consumed."""
    for i, child in enumerate(record["loaders"]):
        if child is None:
            continue
        loader, place = mix.loaders[i], f"{where}['loaders'][{i}]"
        checked = check_pass_record(loader.source, loader.stages, child, place)
        if checked["position"] != record["counts"][i]:
            msg = (
                f"load_state_dict: {place}['position'] is {checked['position']}, and "
                f"{where}['counts'][{i}] says {record['counts'][i]} of its items were consumed"
            )
            raise ValueError(msg)


def _size(loader: Loader[Any]) -> int | None:
    try:
        return len(loader)
    except TypeError:  # only known by running it
        return None


def _check_pass(mix: _Mix, record: dict[str, Any], where: str, epoch: int) -> None:
    """Refuse a (checked) record whose loaders' records belong to other passes than the
    ones a resumed epoch *epoch* runs (loader ``i``'s epoch ``epoch + cycles[i]``, with
    the seeds this mix's loaders have: give this mix the state's seeds first), as a
    state's stages are checked (their ``check_pass``): a buffer shuffle's record from
    another loader or pass would refill its buffer with other items."""
    for i, child in enumerate(record["loaders"]):
        if child is None:
            continue
        loader, run = mix.loaders[i], epoch + record["cycles"][i]
        place = f"{where}['loaders'][{i}]"
        by_flat = {flat_index(loader.stages, k): k for k in range(len(loader.stages))}
        for key, saved in child.get("stages", {}).items():
            stage = loader.stages[by_flat[int(key)]]
            check = stage.resume.check_pass
            if check is not None:
                check(stage, saved, f"{place}['stages'][{key!r}] (stage {stage.name!r})", run)
        if child.get("source") is not None:
            source_check = loader.source.resume.check_pass
            if source_check is not None:
                source_check(loader.source, child["source"], f"{place}['source']", run)


class _Mix(Source[Any]):
    name = "mix"
    uses_hooks = True
    #: A resumed pass resumes each loader from the record, and the record of each belongs
    #: to the pass of it the resumed epoch runs.
    resume = Rule.recorded(_Record, must_hold=True, check_pass=_check_pass)

    def __init__(
        self, loaders: tuple[Loader[Any], ...], weights: tuple[float, ...], seed: int, stop: str
    ) -> None:
        self.loaders, self.weights, self.seed, self.stop = loaders, weights, seed, stop

    def iterate(self, context: Context, hooks: Hooks | None = None) -> Iterator[Any]:
        hooks = hooks or Hooks()
        saved = hooks.saved
        record = _Record(self, saved, context.start)
        hooks.record = record
        return self._run(context, record, saved)

    def _run(
        self, context: Context, record: _Record, saved: dict[str, Any] | None
    ) -> Iterator[Any]:
        key = derive(self.seed, MIX, context.epoch)
        n = len(self.loaders)
        its = self._start(context, record, saved)
        counts, ended, passes = record.counts, record.ended, record.passes
        position = context.start
        cycle = self.stop == "cycle"
        try:
            while True:
                live = [i for i in range(n) if not ended[i]]
                if not live or (cycle and all(passes[j] or ended[j] for j in range(n))):
                    record.finished = True  # ("cycle": every loader has run out once, the
                    return  # last an empty one, found out after the others started again)
                total = sum(self.weights[i] for i in live)
                u, i = _uniform(key, position) * total, live[-1]
                for j in live:
                    u -= self.weights[j]
                    if u < 0:
                        i = j
                        break
                try:
                    item = next(its[i])
                except StopIteration:
                    if self.stop == "first":
                        record.finished = True
                        return
                    if self.stop == "cycle" and counts[i]:
                        if not passes[i] and all(passes[j] or ended[j] for j in range(n) if j != i):
                            record.finished = True
                            return  # every loader has run out once: the mix ends here
                        passes[i] += 1
                        counts[i] = 0
                        self.loaders[i].set_epoch(context.epoch + passes[i])
                        its[i] = iter(self.loaders[i])
                        record.started(i, self.loaders[i])
                        continue
                    ended[i] = True  # ("cycle": an empty loader is not started again)
                    record.ends.append((position, i))
                    continue
                counts[i] += 1
                record.made.append((i, counts[i], passes[i]))
                position += 1
                yield item
        finally:
            for it in its:
                if it is not None:
                    it.close()

    def _start(self, context: Context, record: _Record, saved: dict[str, Any] | None) -> list[Any]:
        """Each loader's pass in play (resumed where the state says)."""
        n = len(self.loaders)
        its: list[Any] = [None] * n
        for i, loader in enumerate(self.loaders):
            if record.ended[i]:
                continue
            loader.set_epoch(context.epoch + record.passes[i])
            child = (saved or {}).get("loaders", [None] * n)[i]
            if child is not None:
                loader.resume_from(context.epoch + record.passes[i], child)
            its[i] = iter(loader)
            record.started(i, loader)
        return its

    def length(self) -> int | None:
        return None

    def describe(self) -> str:
        inner = ", ".join(repr(x).replace("\n", " ") for x in self.loaders)
        return (
            f"mix([{inner}], weights={list(self.weights)}, seed={self.seed!r}, stop={self.stop!r})"
        )

    def seed_slots(self) -> list[tuple[str, int]]:
        return [("mix", self.seed), *(s for x in self.loaders for s in x.seed_slots())]

    def with_seeds(self, seeds: Iterator[int]) -> _Mix:
        seed = next(seeds)
        loaders = tuple(x.with_seeds(seeds) for x in self.loaders)
        return _Mix(loaders, self.weights, seed, self.stop)

    def close(self) -> None:
        for x in self.loaders:
            x.close()


def mix(
    loaders: Sequence[Loader[Any]],
    *,
    weights: Sequence[float] | None = None,
    seed: int | None = None,
    stop: str = "all",
) -> Loader[Any]:
    """Interleave several loaders by weight: each item comes from loader ``i`` with
    probability ``weights[i] / sum(weights)`` (of the loaders still in play), drawn from
    ``(seed, epoch, position)`` alone, so an epoch's mix is the same in every run.

    Args:
        loaders: the loaders to mix (each runs its own passes; in epoch *e* each one runs its
            epoch *e*, a restart its epoch *e + 1*, *e + 2*, ...).
        weights: one positive weight per loader (equal by default).
        seed: the draws' seed; ``None`` draws one (it travels in a state).
        stop: when the epoch ends: ``"first"`` (as soon as one loader runs out),
            ``"all"`` (a loader that runs out leaves the mix; the epoch ends with the last:
            every item of every loader once) or ``"cycle"`` (a loader that runs out starts
            again, until every loader has run out once: the smaller ones are repeated).

    Raises:
        TypeError, ValueError: for loaders that are not pipeflow loaders (or one given twice),
            weights that are not positive numbers, one per loader, or another *stop*.

    Examples:
        >>> import pipeflow as pf
        >>> loader = pf.mix([pf.from_iterable("abc"), pf.from_iterable("XY")], seed=0)
        >>> sorted(loader)
        ['X', 'Y', 'a', 'b', 'c']
        >>> short = pf.mix([pf.from_iterable("abc"), pf.from_iterable("X")], seed=0, stop="cycle")
        >>> sorted(set(short)) == ['X', 'a', 'b', 'c']
        True
    """
    if isinstance(loaders, Loader) or not isinstance(loaders, (list, tuple)):
        msg = f"mix: loaders must be a list of pipeflow loaders (got {type(loaders).__name__})"
        raise TypeError(msg)
    loaders = tuple(loaders)
    if not loaders or not all(isinstance(x, Loader) for x in loaders):
        msg = f"mix: loaders must be a non-empty list of pipeflow loaders (got {loaders!r})"
        raise TypeError(msg)
    if len({id(x) for x in loaders}) != len(loaders):
        raise ValueError("mix: a loader is given twice; build one loader per source")
    if weights is None:
        weights = [1.0] * len(loaders)
    weights = tuple(weights)
    if len(weights) != len(loaders) or not all(
        isinstance(w, (int, float)) and not isinstance(w, bool) and 0 < w < float("inf")
        for w in weights
    ):
        msg = f"mix: weights must be {len(loaders)} positive numbers (got {list(weights)!r})"
        raise ValueError(msg)
    _checks.one_of("mix", "stop", stop, _STOPS)
    seed = fresh_seed() if seed is None else check_seed("mix", seed)
    return Loader(_Mix(loaders, tuple(float(w) for w in weights), seed, stop))
