"""Decoders by file extension, as a WebDataset sample's fields are named.

A tar sample is a dict keyed by extension (``"jpg"``, ``"json"``, ``"cls"``...). With
``decode=True`` a reader turns each field whose extension it knows into a value:

===================================  ==========================================================
extension                            value
===================================  ==========================================================
``jpg jpeg png ppm pgm pbm bmp      an RGB ``numpy.uint8`` array of shape ``(H, W, 3)``
gif tif tiff webp``                  (Pillow)
``json``                             ``json.loads``
``txt text caption``                 ``str`` (UTF-8)
``cls cls2 index inx id``            ``int``
``npy``                              ``numpy.load``
anything else                        the bytes, unchanged
===================================  ==========================================================

A mapping ``{extension: function}`` adds decoders or replaces these (``None`` keeps the
bytes). A field's extension is looked up whole, then by its last part: ``"seg.png"`` is
decoded by a ``"seg.png"`` decoder when there is one, else as ``"png"``.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping
from typing import Any

from pipeflow.errors import _add_note

__all__ = ["decode_sample", "decoders"]

Decoder = Callable[[bytes], Any]


def _image(data: bytes) -> Any:
    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img.convert("RGB"))


def _npy(data: bytes) -> Any:
    import numpy as np

    return np.load(io.BytesIO(data), allow_pickle=False)


def _text(data: bytes) -> str:
    return data.decode("utf-8")


def _int(data: bytes) -> int:
    return int(data.decode("utf-8").strip())


_DEFAULTS: dict[str, Decoder | None] = {
    **dict.fromkeys(
        ("jpg", "jpeg", "png", "ppm", "pgm", "pbm", "bmp", "gif", "tif", "tiff", "webp"), _image
    ),
    "json": json.loads,
    **dict.fromkeys(("txt", "text", "caption"), _text),
    **dict.fromkeys(("cls", "cls2", "index", "inx", "id"), _int),
    "npy": _npy,
}


def decoders(stage: str, decode: Any) -> dict[str, Decoder | None] | None:
    """The decoders a reader's ``decode=`` argument asks for (``None``: bytes), checked.

    Examples:
        >>> decoders("read_tar", False) is None
        True
        >>> sorted(decoders("read_tar", {"seg": bytes.upper}))[:3]
        ['bmp', 'caption', 'cls']
    """
    if decode is False or decode is None:
        return None
    if decode is True:
        return dict(_DEFAULTS)
    if isinstance(decode, Mapping):
        for ext, fn in decode.items():
            if not isinstance(ext, str) or (fn is not None and not callable(fn)):
                msg = (
                    f"{stage}: decode must map extensions to functions or None "
                    f"(got {ext!r}: {fn!r})"
                )
                raise TypeError(msg)
        return {**_DEFAULTS, **{k.lower(): v for k, v in decode.items()}}
    msg = (
        f"{stage}: decode must be True, False or a mapping from extension to function "
        f"(got {decode!r})"
    )
    raise TypeError(msg)


def decode_sample(sample: dict[str, Any], table: Mapping[str, Decoder | None]) -> dict[str, Any]:
    """*sample* with each field decoded by its extension, looked up whole and then by its
    last part (``__key__`` and the like kept).

    Raises:
        Exception: the decoder's, with a note naming the field.

    Examples:
        >>> table = {"seg.png": bytes.upper, "png": bytes.lower}
        >>> decode_sample({"__key__": "a", "seg.png": b"Ab", "x.png": b"Ab"}, table)
        {'__key__': 'a', 'seg.png': b'AB', 'x.png': b'ab'}
    """
    out = {}
    for ext, value in sample.items():
        fn = None if ext.startswith("__") else _decoder(ext.lower(), table)
        if fn is None:
            out[ext] = value
            continue
        try:
            out[ext] = fn(value)
        except Exception as e:
            _add_note(
                e, f"pipeflow: decoding the field {ext!r} of sample {sample.get('__key__')!r}"
            )
            raise
    return out


def _decoder(ext: str, table: Mapping[str, Decoder | None]) -> Decoder | None:
    """The decoder of the (lowercased) extension *ext*: its own, else its last part's."""
    if ext in table:
        return table[ext]
    return table.get(ext.rsplit(".", 1)[-1])
