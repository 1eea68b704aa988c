"""Stages made with ``@pf.stage`` as a user would write them, shared by test_decorate.py and
test_stage.py (module level, so they pickle)."""

from __future__ import annotations

import pipeflow as pf


@pf.stage(length="same")
def add_noise(samples, *, scale=0.1):
    for s in samples:
        yield s + scale


@pf.stage
def with_epoch(items, *, epoch):
    for x in items:
        yield (epoch, x)
