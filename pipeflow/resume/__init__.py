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
- ``_rngs``, ``_states``: a worker's global generators, and the workers' states by the items
  they delivered.

The records of the stages that keep one live with their stage (a buffer shuffle's in
``stages/shuffle``, a reader's in ``sources/readers/_reader``, the parallel stages' in
``parallel/_records``): each declares its form here, and is checked here.

It imports only the ground floor (``_random``); every other room imports it (see the design
page's rooms).
"""
