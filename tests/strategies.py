"""Hypothesis strategies shared by the test modules."""

from __future__ import annotations

from hypothesis import strategies as st

lengths = st.integers(min_value=0, max_value=300)
batch_sizes = st.integers(min_value=1, max_value=70)
seeds = st.integers(min_value=0, max_value=2**64 - 1)
epochs = st.integers(min_value=0, max_value=1000)
