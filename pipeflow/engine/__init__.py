"""The engine: the two protocols, the plan, the runner and its wrappers, the loader.

- ``_stage``: :class:`~pipeflow.Stage` (a generator function and its frozen configuration,
  with its resume rule and its :class:`~pipeflow.Traits`), :class:`~pipeflow.Source` and
  ``Pipe``; ``_decorate``: ``@pf.stage``;
- ``_context``: what a pass tells each stage (``Context``), and the loader's private hooks;
  ``_failure``: a failed item, travelling as a value;
- ``_plan``: the planning step (what the loader computes instead of running), with
  ``_permutation``, the full shuffle's bijection computed per position;
- ``_chain``: one pass; ``_wrappers``: what the runner stacks around each stage;
- ``loader``: the re-iterable :class:`~pipeflow.Loader`; ``_layout``: its repr.

It imports :mod:`pipeflow.resume` (a stage declares its rule; the loader takes and checks
states) and the ground floor (``errors``, ``_checks``, ``_random``, ``_hints``, ``stats``),
never the stages, the sources, the parallel package or the facade, which stand on it.
"""
