"""The stages a user composes: one module per family of factories.

``batch`` (and ``_budget``: batches by token budget), ``shuffle``, ``fetch``, ``transforms``
(``map``, ``filter``, ``random_map``), ``collate`` (with ``_collate_torch``, the drop-in
``default_collate``; ``_convert``, ``default_convert``; ``_pending``, the numpy-only collate
of a worker without torch; ``_alloc``, where a collate makes its batch), ``pad``, ``device``
(``pin_memory``, ``to_device``), ``distributed`` (``shard``), ``progress``, ``bucket`` and
``pack`` (with ``_lengths``, what the sequence stages share), ``ignore`` (``ignore_errors``).

A stage module imports :mod:`pipeflow.engine` (the stage protocol), :mod:`pipeflow.resume`
(its rule, and its record's form when it keeps one) and the ground floor; never another
room above it (sources, parallel, the facade).
"""
