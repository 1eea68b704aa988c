"""benchmarks/cache.py on a tiny configuration: every row runs, counts its epochs, and gives
the uncached pipeline's samples (the pipeflow rows in the same order: the same seed). Its
speed and memory are measured by running it, not here."""

from __future__ import annotations

import json
from typing import Any

import pytest

from benchmarks import cache

pytest.importorskip("PIL")


@pytest.mark.slow
def test_every_row_runs_and_the_cached_rows_give_the_uncached_samples(capsys: Any) -> None:
    args = ["--items", "64", "--epochs", "2", "--reps", "1", "--check", "--json"]
    assert cache.main(args) == 0
    result = json.loads(capsys.readouterr().out)
    by = {row["variant"]: row for row in result["rows"]}
    assert list(by) == list(cache.VARIANTS)
    (plain,) = by["pf-uncached"]["runs"]
    assert plain["seen"] == [64, 64] and len(plain["digests"]) == 2
    assert sorted(plain["digests"][0]) == sorted(plain["digests"][1])  # the same 64 samples
    for name, row in by.items():
        (run,) = row["runs"]
        assert run["epochs"] == 2 and run["seen"] == [64, 64], name
        assert row["same_output"], name  # each epoch's checksum
        for ours, theirs in zip(run["digests"], plain["digests"]):
            if name.startswith("pf"):  # shuffle(seed=0): the same order
                assert ours == theirs, name
            else:  # torch's own shuffle: the same samples
                assert sorted(ours) == sorted(theirs), name
        cached = name in cache.CACHED
        assert (run["cache_hits"], run["cache_misses"]) == ((64, 64) if cached else (0, 0))
        assert (run["cache_bytes"] >= 64 * 96 * 96 * 3) is cached, name
    assert by["pf-cache-workers"]["runs"][0]["shm_file_bytes"] > 0  # the shared files counted
    assert len(cache.goals(result)) == len(cache.CACHED) * len(cache.GOALS)
    table = cache.format_table(result)
    assert all(name in table for name in cache.VARIANTS)
