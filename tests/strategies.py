"""Hypothesis strategies shared by the test modules."""

from __future__ import annotations

from hypothesis import strategies as st

lengths = st.integers(min_value=0, max_value=300)
batch_sizes = st.integers(min_value=1, max_value=70)
seeds = st.integers(min_value=0, max_value=2**64 - 1)
epochs = st.integers(min_value=0, max_value=1000)

# -- variable-length data (issue 26) ---------------------------------------------------------
#: The lengths of one batch of ragged items (at least one item).
ragged_lengths = st.lists(st.integers(min_value=0, max_value=20), min_size=1, max_size=12)
#: An epoch of sequence lengths, with the long tail the sequence stages are for: mostly short,
#: some longer than a row of 16 tokens, some empty.
sequence_lengths = st.lists(
    st.one_of(st.integers(0, 6), st.integers(7, 40)), min_size=0, max_size=80
)
