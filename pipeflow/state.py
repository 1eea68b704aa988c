"""Exact resumption: what ``Loader.state_dict()`` records, and how it is checked and replayed.

A state is a small JSON-serialisable dict:

```python
{
    "pipeflow_state": 1,              # the format's version
    "epoch": 3,                       # the epoch to resume
    "position": 1200,                 # outputs of that epoch already consumed
    "stages": {"4": {"prefix": 8000, "extras": [8003, 8010]}},  # out-of-order stages
    "pipeline": ["indices(50000)", "shuffle(seed=0)", "batch(size=64, drop_last=False)", ...],
    "length": 782,                    # outputs per epoch, when known
}
```

Resuming skips the consumed items *below* the stages that make batches of them: the first
``position`` outputs of ``indices | shuffle | batch(64) | fetch | collate`` are the first
``64 * position`` shuffled indices, so the resumed pass drops those indices and fetches,
decodes and collates only what is left. A stage that is not a map or a batch (a ``filter``,
say) cannot be skipped through: consumed items are replayed through it and dropped after it.

An unordered ``parallel_map`` delivers items out of order, so "the first k" is not enough: its
state lists what it delivered — every item before ``prefix``, and the ``extras`` after it.

Workers, backends and in-flight limits are not part of a pipeline's identity: a state resumes
with any worker count. Seeds, sizes and the stage list are: a state from another pipeline is
refused with ``ValueError``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeflow.loader import Loader, _Progress

__all__ = ["VERSION", "check", "fingerprint", "stage_positions", "take"]

VERSION = 1


def _identity(stage: Any) -> list[str]:
    identity = getattr(stage, "identity", None)
    return identity() if identity is not None else [repr(stage)]


def fingerprint(loader: Loader[Any]) -> list[str]:
    """The pipeline's identity: its source and every stage, without runtime knobs.

    A ``parallel_map`` in order counts as the stages it runs, so states move freely between
    runs with and without workers.
    """
    return [loader.source.describe(), *(x for s in loader.stages for x in _identity(s))]


def _flat_index(loader: Loader[Any], index: int) -> int:
    """Where stage *index* starts in the fingerprint (after the source)."""
    return sum(len(_identity(s)) for s in loader.stages[:index])


def _stage_index(loader: Loader[Any], flat: int) -> int:
    for i in range(len(loader.stages)):
        if _flat_index(loader, i) == flat:
            return i
    msg = f"load_state_dict: the state names a stage at {flat} that this pipeline does not have"
    raise ValueError(msg)


def _length(loader: Loader[Any]) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


def take(loader: Loader[Any], progress: _Progress | None) -> dict[str, Any]:
    """The state of *loader*, given its latest pass."""
    length = _length(loader)
    stages: dict[str, Any] = {}
    if progress is None or progress.superseded:
        epoch = loader._next_epoch
        position = loader._next.get("position", 0)
        stages = {str(_flat_index(loader, k)): v for k, v in loader._next.get("stages", {}).items()}
    elif progress.done:
        epoch, position = progress.epoch + 1, 0
    else:
        epoch, position = progress.epoch, progress.start + progress.delivered
        for index, record in progress.records.items():
            after = loader.stages[index + 1 :]
            consumed: int | None = progress.delivered
            for s in reversed(after):
                consumed = None if consumed is None else s.skipped_inputs(consumed)
            if consumed is None:
                msg = (
                    f"state_dict: stage {loader.stages[index].name!r} delivers out of order, "
                    "and a stage after it is not a map or a batch, so what was consumed can't "
                    "be told; use ordered=True, or move that stage before it"
                )
                raise ValueError(msg)
            flat = _flat_index(loader, index)
            stages[str(flat)] = loader.stages[index].resume_state(record, consumed)
    if length is not None and position >= length and not stages:
        epoch, position = epoch + 1, 0  # the end of an epoch is the start of the next
    return {
        "pipeflow_state": VERSION,
        "epoch": epoch,
        "position": position,
        "stages": stages,
        "pipeline": fingerprint(loader),
        "length": length,
    }


def check(loader: Loader[Any], state: Any) -> None:
    """Refuse a *state* that is not from a pipeline like *loader*, naming what differs."""
    if not isinstance(state, dict) or state.get("pipeflow_state") != VERSION:
        msg = (
            "load_state_dict: not a pipeflow loader state (expected a dict from "
            f"state_dict() with pipeflow_state={VERSION})"
        )
        raise ValueError(msg)
    for key, kind in (("epoch", int), ("position", int), ("pipeline", list)):
        if not isinstance(state.get(key), kind) or isinstance(state.get(key), bool):
            msg = (
                f"load_state_dict: state[{key!r}] must be a {kind.__name__} "
                f"(got {state.get(key)!r})"
            )
            raise ValueError(msg)
    if state["epoch"] < 0 or state["position"] < 0:
        msg = (
            "load_state_dict: epoch and position must be at least 0 "
            f"(got {state['epoch']}, {state['position']})"
        )
        raise ValueError(msg)
    here = fingerprint(loader)
    there = state["pipeline"]
    if here != there:
        for i, (a, b) in enumerate(zip(here, there)):
            if a != b:
                what = "the source" if i == 0 else f"stage {i}"
                msg = (
                    f"load_state_dict: the state is from a different pipeline: {what} is {a} "
                    f"here but {b} in the state"
                )
                raise ValueError(msg)
        msg = (
            f"load_state_dict: the state is from a different pipeline: {len(here) - 1} stages "
            f"here, {len(there) - 1} in the state ({' | '.join(there)})"
        )
        raise ValueError(msg)
    length = _length(loader)
    if state.get("length") != length:
        msg = (
            f"load_state_dict: the state is from a pipeline of another length: {length} "
            f"outputs per epoch here, {state.get('length')} in the state"
        )
        raise ValueError(msg)


def stage_positions(loader: Loader[Any], stages: dict[str, Any]) -> dict[int, Any]:
    """A state's out-of-order stage records, keyed by this loader's stage positions."""
    return {_stage_index(loader, int(k)): v for k, v in stages.items()}
