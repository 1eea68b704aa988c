"""The ``torch.utils.data`` facade: ``pipeflow.DataLoader`` and ``StatefulDataLoader``.

- ``dataloader``: torch's ``DataLoader`` signature and semantics, built from public stages;
  ``_facade``: what makes it behave as torch's does (collate in workers by torch's dtype
  rules, an iterable dataset read without ``len()``, the sampler drawn at ``iter()``,
  torch's words in worker errors);
- ``_datapipes``: a torch DataPipe split per worker and shuffled from one seed per epoch;
- ``_facade_state``: what a DataLoader's state adds to its pipeline's (torch's arguments,
  the generators);
- ``stateful_dataloader``: torchdata's ``StatefulDataLoader`` on top.

It may import every room below it (engine, resume, stages, sources, parallel); nothing but
the package's ``__init__`` imports it.
"""
