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

# -- messages (issue 27) ---------------------------------------------------------------------
_LETTERS = "abcdefghijklmnopqrstuvwxyz_"


@st.composite
def misspellings(draw: st.DrawFn, word: str) -> str:
    """*word* with one typing slip: a letter dropped, doubled, swapped with the next one, or
    replaced (the slip may give another valid word; callers filter those)."""
    i = draw(st.integers(0, len(word) - 1))
    slip = draw(st.sampled_from(["drop", "double", "swap", "replace"]))
    if slip == "drop" and len(word) > 1:
        return word[:i] + word[i + 1 :]
    if slip == "swap" and i + 1 < len(word):
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    if slip == "replace":
        return word[:i] + draw(st.sampled_from(_LETTERS)) + word[i + 1 :]
    return word[:i] + word[i] + word[i:]


#: Things that are not pipeflow objects, of the kinds a new user puts next to ``|``: numbers,
#: strings, lists, dicts, functions, classes, datasets (anything with ``__getitem__``).
not_stages = st.one_of(
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=4),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
    st.sampled_from([len, print, abs, object(), type, range(3), b"ab", None, ...]),
)
