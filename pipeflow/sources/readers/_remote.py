"""Remote stores, before any byte is read: the ``timeout=`` every request gets, the package
a URL's file system needs (named with the extra that brings it), and a store that refuses
the credentials (a note on how to pass them). :func:`~pipeflow.sources.shards` and the readers share
these, so a user meets the same words at build time and at the first read.
"""

from __future__ import annotations

import numbers
import threading
from typing import Any

__all__ = [
    "TIMEOUT",
    "check_timeout",
    "credentials_note",
    "import_file_system",
    "missing_package",
    "no_credentials",
    "refused",
]


#: Seconds a request may take (the readers' and :func:`~pipeflow.sources.shards`' ``timeout=``).
TIMEOUT = 60.0


def check_timeout(stage: str, value: Any) -> float:
    """*value* as the seconds a request may take: a finite number above 0 (a read must end).

    Examples:
        >>> check_timeout("read_tar", 0)
        Traceback (most recent call last):
        ...
        ValueError: read_tar: timeout must be a finite number of seconds above 0 (got 0)
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        msg = (
            f"{stage}: timeout must be a number of seconds (got {value!r}): every request "
            "needs one, so that a store that stops answering fails the read instead of hanging"
        )
        raise TypeError(msg)
    if not 0 < float(value) <= threading.TIMEOUT_MAX:  # 0, negative, NaN, inf
        msg = f"{stage}: timeout must be a finite number of seconds above 0 (got {value!r})"
        raise ValueError(msg)
    return float(value)


#: The package fsspec needs for a protocol, and how to get it.
_STREAM = "pip install 'pipeflow[stream]'"
_PACKAGES = {
    "s3": ("s3fs", _STREAM),
    "s3a": ("s3fs", _STREAM),
    "http": ("aiohttp", _STREAM),
    "https": ("aiohttp", _STREAM),
    "gs": ("gcsfs", "pip install gcsfs (pipeflow[stream] does not bring it)"),
    "gcs": ("gcsfs", "pip install gcsfs (pipeflow[stream] does not bring it)"),
    "az": ("adlfs", "pip install adlfs (pipeflow[stream] does not bring it)"),
    "abfs": ("adlfs", "pip install adlfs (pipeflow[stream] does not bring it)"),
    "abfss": ("adlfs", "pip install adlfs (pipeflow[stream] does not bring it)"),
}


def missing_package(url: str, what: str, error: BaseException) -> str:
    """The message for *url*'s file system not importing: the package and how to install it
    (*what*: "shard", "pattern")."""
    protocol = url.split("://", 1)[0]
    package, how = _PACKAGES.get(protocol, (None, None))
    if package is None:
        return f"{what} {url!r} needs a package that is not installed ({error})"
    return f"{what} {url!r} needs {package}, which is not installed: {how} ({error})"


def import_file_system(url: str, what: str) -> None:
    """Import fsspec's file system for *url* now: an :class:`ImportError` that names the
    package and how to install it, rather than fsspec's at the first read. A protocol
    fsspec does not know is left to the reader, which names the shard."""
    try:
        import fsspec
    except ImportError as e:
        msg = f"{what} {url!r} needs fsspec, which is not installed: {_STREAM}"
        raise ImportError(msg, name="fsspec") from e
    try:
        fsspec.get_filesystem_class(url.split("://", 1)[0])
    except ValueError:
        return
    except ImportError as e:
        package = _PACKAGES.get(url.split("://", 1)[0], (None,))[0]
        raise ImportError(missing_package(url, what, e), name=package) from e


_NO_CREDENTIALS = {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"}


def no_credentials(error: BaseException) -> bool:
    """Whether *error* is the client finding no credentials to send (botocore's)."""
    return bool({c.__name__ for c in type(error).__mro__} & _NO_CREDENTIALS)


def refused(error: BaseException) -> bool:
    """Whether *error* is a store refusing the credentials (or finding none to send): a
    failure that a retry does not mend."""
    if isinstance(error, PermissionError):
        return True
    if no_credentials(error):
        return True
    return getattr(error, "status", None) in (401, 403)  # aiohttp's answer


def credentials_note(where: str, url: str, error: BaseException) -> str:
    """A note for a store that refused the credentials: *where* (the shard, the listing),
    what went wrong, and how to pass them."""
    what = (
        "found no credentials to send"
        if no_credentials(error)
        else "the store refused the credentials (wrong, expired, or without access to it)"
    )
    if url.split("://", 1)[0] in ("s3", "s3a"):
        how = (
            "pass them as storage_options={'key': ..., 'secret': ..., 'client_kwargs': "
            "{'endpoint_url': ...}} to pf.shards and to the reader (endpoint_url for a store "
            "other than AWS), or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and "
            "AWS_ENDPOINT_URL) in the environment"
        )
    else:
        how = (
            "pass them in storage_options= to pf.shards and to the reader, as the file "
            "system's documentation says"
        )
    return f"pipeflow: {where}: {what}: {how}"
