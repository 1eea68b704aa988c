"""``pipeflow.DataLoader``'s state: its pipeline's, plus what torch's arguments decide.

A DataLoader's state is its pipeline's state (:meth:`pipeflow.Loader.state_dict`) and:

- ``"dataloader"``: what the DataLoader is, in torch's words (``batch_size``, ``drop_last``,
  ``shuffle``, ``len(dataset)``, the sampler...): a state is refused by a DataLoader that
  differs in any of them, naming it (``batch_size is 8 here but 7 in the state``);
- ``"generators"``: the random generators the samplers draw from (the DataLoader's
  ``generator``, else torch's global one; a sampler's own) as they were when the pass began,
  so the resumed pass draws the same order;
- ``"base_seed"``: persistent workers' base seed, drawn once for all epochs, and
  ``"draws_base_seed"``: whether the next pass draws one (as the pass it resumes did: its
  draws from the generators are then the same as the uninterrupted run's);
- ``"digest"``: binds the generators and the base seed to the pipeline's state (its epoch,
  position and digests, see :mod:`pipeflow.resume._seal`): a generator state changed after
  ``state_dict()`` gave it, or taken from another state, would draw another order, and is
  refused.

:func:`check` checks all of it, and the pipeline's part, before anything changes.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import torch
import torch.utils.data as tud
from torch.utils.data.dataloader import _DatasetKind

from pipeflow.engine._stage import _short
from pipeflow.resume._seal import digest
from pipeflow.resume.state import integer, record_keys
from pipeflow.sources._samplers import describe_sampler

__all__ = [
    "VERSION",
    "check",
    "check_digest",
    "digest_of",
    "generators",
    "identity",
    "set_generators",
]

VERSION = 3
#: The formats :func:`check` reads: format 2 (before the digest) is checked without it.
_READS = (2, 3)


def _fail(msg: str) -> ValueError:
    return ValueError(f"load_state_dict: {msg}")


def identity(dl: Any) -> dict[str, Any]:
    """What *dl* is, in torch's argument names, as a state compares it (JSON-ready)."""
    iterable = dl._dataset_kind == _DatasetKind.Iterable
    out: dict[str, Any] = {"dataset": "IterableDataset" if iterable else "map-style"}
    if iterable:
        out["num_workers"] = dl.num_workers  # each worker reads its own replica
    else:
        out["len(dataset)"] = len(dl.dataset)
        out["shuffle"] = isinstance(dl.sampler, tud.RandomSampler)
    out["batch_size"] = dl.batch_size
    out["drop_last"] = bool(dl.drop_last)
    if not iterable:
        out["sampler"] = describe_sampler(dl.sampler)
        if dl.batch_size is None and dl.batch_sampler is not None:
            out["batch_sampler"] = describe_sampler(dl.batch_sampler)
    out["collate_fn"] = _short(dl.collate_fn)
    out["generator"] = "given" if dl.generator is not None else "None (torch's global one)"
    return out


def _own_generator(dl: Any) -> torch.Generator | None:
    """The sampler's own generator, when it is not the DataLoader's."""
    g = getattr(dl.sampler, "generator", None)
    return g if isinstance(g, torch.Generator) and g is not dl.generator else None


def _encode(g: torch.Generator | None) -> str:
    state = g.get_state() if g is not None else torch.get_rng_state()
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def generators(dl: Any) -> dict[str, str | None]:
    """The states of the generators *dl*'s samplers draw from, now."""
    own = _own_generator(dl)
    return {"generator": _encode(dl.generator), "sampler": _encode(own) if own else None}


def _decode(text: Any, g: torch.Generator | None, where: str) -> torch.Tensor:
    """A generator state from *text*, checked against what *g* (``None``: torch's global
    generator) takes, without touching it."""
    if not isinstance(text, str):
        msg = f"{where} must be a base64 string (got {type(text).__name__})"
        raise _fail(msg)
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        msg = f"{where} is not base64"
        raise _fail(msg) from None
    want = (g.get_state() if g is not None else torch.get_rng_state()).numel()
    if len(raw) != want:
        msg = f"{where} holds {len(raw)} bytes, and this generator's state is {want}"
        raise _fail(msg)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def check(dl: Any, state: Any) -> tuple[dict[str, torch.Tensor | None], int | None, bool]:
    """Refuse *state* when it is malformed or from another DataLoader, naming the key or
    the setting; return the generators' states to set, persistent workers' base seed, and
    whether the next pass draws one."""
    if not isinstance(state, dict) or "pipeflow_dataloader" not in state:
        msg = (
            "not a pipeflow.DataLoader state (expected the dict from a DataLoader's "
            f"state_dict(), with pipeflow_dataloader={VERSION})"
        )
        raise _fail(msg)
    version = state["pipeflow_dataloader"]
    if isinstance(version, bool) or version not in _READS:
        msg = (
            f"the state is in format {version!r}, and this pipeflow reads formats "
            f"{', '.join(map(str, _READS))}: take the state again with this version"
        )
        raise _fail(msg)
    keys = {
        "pipeflow_dataloader",
        "dataloader",
        "loader",
        "generators",
        "base_seed",
        "draws_base_seed",
    }
    record_keys(state, "the state", keys | ({"digest"} if version == VERSION else set()), set())
    if not isinstance(state["loader"], dict):
        raise _fail(f"state['loader'] must be a dict (got {type(state['loader']).__name__})")
    _check_identity(identity(dl), state["dataloader"])
    gens = state["generators"]
    record_keys(gens, "state['generators']", {"generator", "sampler"}, set())
    out: dict[str, torch.Tensor | None] = {
        "generator": _decode(gens["generator"], dl.generator, "state['generators']['generator']")
    }
    own = _own_generator(dl)
    if (gens["sampler"] is None) != (own is None):
        msg = "state['generators']['sampler'] does not match: the sampler's own generator"
        raise _fail(msg)
    out["sampler"] = None if own is None else _decode(gens["sampler"], own, "the sampler's")
    seed = state["base_seed"]
    if seed is not None:
        integer(seed, "state['base_seed']", -(2**63), 2**63 - 1)
    draws = state["draws_base_seed"]
    if not isinstance(draws, bool) or (not draws and seed is None):
        msg = (
            f"state['draws_base_seed'] must be a bool, False only with a base_seed (got {draws!r})"
        )
        raise _fail(msg)
    return out, seed, draws


def check_digest(state: dict[str, Any]) -> None:
    """Refuse generators and a base seed that do not match the state's digest (after
    :func:`check`, and the pipeline's check, said what they could in their own words)."""
    if state["pipeflow_dataloader"] == VERSION and state["digest"] != digest_of(state):
        msg = (
            "state['generators'], state['base_seed'] or state['draws_base_seed'] do not match "
            "the state's digest: they were changed after state_dict() gave them, or come from "
            "another state (the resumed pass would draw another order)"
        )
        raise _fail(msg)


def digest_of(state: dict[str, Any]) -> str:
    """The digest binding a DataLoader state's generators and base seed to its pipeline's
    state (its epoch, position and digests)."""
    loader = state["loader"]
    return digest(
        "dataloader",
        [loader.get(k) for k in ("pipeline", "epoch", "position", "digests")],
        state["generators"],
        state["base_seed"],
        state["draws_base_seed"],
    )


def _check_identity(here: dict[str, Any], there: Any) -> None:
    if not isinstance(there, dict):
        msg = f"state['dataloader'] must be a dict (got {type(there).__name__})"
        raise _fail(msg)
    for key, value in here.items():
        if key not in there:
            msg = f"state['dataloader'] lacks {key!r}"
            raise _fail(msg)
        if there[key] != value:
            msg = (
                f"{key} is {value!r} here but {there[key]!r} in the state: the rest of the "
                "epoch would differ; build the DataLoader as it was when the state was taken"
            )
            raise _fail(msg)
    extra = sorted(set(there) - set(here))
    if extra:
        msg = f"the state's DataLoader has {extra[0]!r}, which this one has not"
        raise _fail(msg)


def set_generators(dl: Any, states: dict[str, torch.Tensor | None]) -> None:
    """Give the generators the (checked) *states*."""
    state = states["generator"]
    assert state is not None
    if dl.generator is not None:
        dl.generator.set_state(state)
    else:
        torch.set_rng_state(state)
    own = _own_generator(dl)
    if own is not None and states["sampler"] is not None:
        own.set_state(states["sampler"])
