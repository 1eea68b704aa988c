"""Where a pipeline's items come from.

- ``_basic``: ``indices``, ``from_iterable``, ``from_sampler`` (a user's object read through
  its iterator, stateful ones restored where a resumed pass starts); ``_samplers``: torch's
  samplers described by their settings, for a state's identity;
- ``shards``: the names of a sharded dataset's shards, shuffled per epoch and split by rank
  and worker; ``readers/``: the stages that turn shards into samples (one module per
  format, the shared reader and its record, a shard's bytes local or remote);
- ``mix``: several loaders interleaved by weight.

It imports :mod:`pipeflow.engine` (the loader and the protocols), :mod:`pipeflow.resume`,
:mod:`pipeflow.stages` (a shard split by rank) and the ground floor; never the parallel
package or the facade.
"""
