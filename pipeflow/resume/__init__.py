"""Exact resumption: one protocol, in one package.

A stage or a source declares how it resumes once, as data (a :class:`~pipeflow.state.Rule`);
a stage that keeps state has a record class (:class:`~pipeflow.state.Record`) whose form is
declared once (:class:`~pipeflow.state.Form`) and checked by one validator
(:func:`~pipeflow.state.conform`). :mod:`pipeflow.state` is the public face.

- ``state``: the declarations, the validator, the skip plan of a resumed pass, and the
  taking of a state;
- ``_check``: how ``load_state_dict`` checks a whole state before anything changes;
- ``_seal``: the digests that bind a state's records to its pipeline, epoch and position;
- ``_seeds``: finding and replacing a pipeline's seeds, so drawn ones travel in a state;
- ``_objects``: the user's stateful objects' snapshots;
- ``_restarts``: the record of the stages with a bounded buffer, which restart where it was
  last empty;
- ``_rngs``, ``_states``, ``_records``: a worker's global generators, the workers' states,
  and the records of ``parallel_map`` and ``parallel_source``.

What it may import: the ground floor (``_random``, ``_context``) and, for the records that
read a stage's configuration, the stage protocol (``_stage``); never the runner, the loader
or the parallel pools, which import it (see the design page's floors).
"""
