"""Exact resumption, the public face of :mod:`pipeflow.resume`: what a state records, how a
stage declares how it resumes, and the skip plan of a resumed pass.

A state is a small JSON-serialisable dict (when the user's objects' states are):

```python
{
    "pipeflow_state": 3,              # the format's version
    "epoch": 3,                       # the epoch to resume
    "position": 1200,                 # outputs of that epoch already consumed
    "length": 782,                    # outputs per epoch, when known
    "pipeline": ["indices(50000)", "shuffle(seed=<seed>)", "batch(size=64, ...)", ...],
    "seeds": [["shuffle", 0, False]],  # every seed: its stage, value, drawn by pipeflow?
    "stages": {"4": {"prefix": 8000, "extras": [8003, 8010]}},  # the stages' records
    "source": {"at": 1200, "object": ..., "iterator": ...},  # the source's, if it keeps one
    "digests": {"seeds": "9f0c...", "stages": {"4": "1be2..."}, "source": "77a0..."},
}
```

What a pipeline *is* — its stages, sizes, dataset length, the seeds the user gave — is
compared when a state is loaded (:mod:`pipeflow.resume._check`), and anything that differs is
refused by name; seeds pipeflow drew itself travel in the state and a freshly built loader
adopts them (:mod:`pipeflow.resume._seeds`), so a new process resumes. Runtime knobs (workers,
backends, in-flight bounds) are not part of it: a map-style pipeline resumes with any worker
count. The ``digests`` bind the seeds and every record to the pipeline, and every record to
the epoch and position it was taken at (:mod:`pipeflow.resume._seal`): a record changed after
``state_dict()`` gave it, or taken from another state, is refused at load.

Each stage declares how its first ``k`` outputs are skipped, once, when it is built: its
:attr:`pipeflow.Stage.resume`, a :class:`Rule` (data the loader reads, not a method it calls):

- ``Rule.below(per)``: skipping its first ``n`` inputs skips exactly its first ``k`` outputs
  (a map: ``n = k``; a batch of 64: ``n = 64 * k``). The question moves up a stage, so the
  first ``position`` outputs of ``indices | shuffle | batch(64) | fetch | collate`` are
  skipped as the first ``64 * position`` shuffled indices: nothing consumed is fetched,
  decoded or collated again.
- ``Rule.seek()``: the stage skips them itself, cheaply (it gets ``context.start = k``).
- ``Rule.replay()``: the consumed items are replayed through the stage and dropped after
  it (a ``filter``: which inputs made the first ``k`` outputs is only known by running it).
- ``Rule.recorded(RecordClass)``: the stage keeps a record of each pass (a :class:`Record`:
  its class's ``begin`` makes it, the stage's function gets it as its ``record`` keyword,
  and its ``FORM`` says what a state may hold of it) whose ``after(consumed)`` says where it
  stood once the consumer had taken ``consumed`` of its outputs, in one of two forms:

  - ``{"prefix": p, "extras": [...]}``: it delivers out of order (an unordered
    ``parallel_map``), so "the first k" is not enough: every item numbered below ``p``, and
    the ``extras`` after it, were delivered, and a resumed pass skips exactly those;
  - ``{"inputs": n}`` or ``{"inputs": n, "start": m}``: a resumed pass skips the stage's
    first ``n`` inputs (``context.offset == n``), and the stage skips its own first ``m``
    outputs after that itself (``context.start == m``): ``ignore_errors`` (the inputs its
    outputs and drops took), or a stage with a bounded buffer that restarts where its
    buffer was last empty and makes the same ``m`` outputs again without yielding them.

Besides, the user's stateful objects (a dataset, sampler or iterable with ``state_dict()``)
are saved where the consumer stood (:mod:`pipeflow.resume._objects`), and so are a parallel stage's
workers' states (:mod:`pipeflow.parallel._records`).

A state saved after the last item of an epoch, before the pass ended, resumes to an empty rest
of that epoch, then the next epoch; a state saved after the pass ended is the next epoch's
start (with what carries into it: a stateful dataset's state, persistent workers' states).
"""

from pipeflow.resume.state import (
    READS,
    VERSION,
    ByWorker,
    Delivery,
    Drops,
    Each,
    Form,
    Int,
    Kept,
    Nested,
    Plan,
    Progress,
    Record,
    Rising,
    Rule,
    Value,
    check_inputs,
    conform,
    digests,
    fingerprint,
    flag,
    integer,
    plan,
    record_keys,
    seeds,
    skipped,
    take,
    taken,
    through,
)

__all__ = [
    "READS",
    "VERSION",
    "ByWorker",
    "Delivery",
    "Drops",
    "Each",
    "Form",
    "Int",
    "Kept",
    "Nested",
    "Plan",
    "Progress",
    "Record",
    "Rising",
    "Rule",
    "Value",
    "check_inputs",
    "conform",
    "digests",
    "fingerprint",
    "flag",
    "integer",
    "plan",
    "record_keys",
    "seeds",
    "skipped",
    "take",
    "taken",
    "through",
]
