"""Fault injectors, defined at module level so they pickle; keyed by sample index, never chance."""

from __future__ import annotations

import ctypes
import os
import signal
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RaiseAt:
    index: int
    exc: type[BaseException] = KeyError

    def __call__(self, i: Any) -> Any:
        if i == self.index or (isinstance(i, list) and self.index in i):
            raise self.exc(f"injected failure at {self.index}")
        return i


@dataclass(frozen=True)
class ExitAt:
    index: int
    code: int = 3

    def __call__(self, i: Any) -> Any:
        if i == self.index:
            os._exit(self.code)
        return i


@dataclass(frozen=True)
class SignalAt:
    index: int
    sig: int = signal.SIGKILL

    def __call__(self, i: Any) -> Any:
        if i == self.index:
            os.kill(os.getpid(), self.sig)
            time.sleep(10)
        return i


@dataclass(frozen=True)
class SegfaultAt:
    index: int

    def __call__(self, i: Any) -> Any:
        if i == self.index:
            ctypes.string_at(0)  # reads address 0: SIGSEGV
        return i


@dataclass(frozen=True)
class HangAt:
    index: int

    def __call__(self, i: Any) -> Any:
        if i == self.index:
            time.sleep(3600)
        return i


@dataclass(frozen=True)
class WaitAt:
    """Block at *index* until the file *path* exists (the consumer creates it): an event
    that works across processes. Gives up after *limit* seconds, so a bug can't hang."""

    index: int
    path: str
    limit: float = 30.0

    def __call__(self, i: Any) -> Any:
        if i == self.index:
            deadline = time.monotonic() + self.limit
            while not os.path.exists(self.path) and time.monotonic() < deadline:
                time.sleep(0.01)
        return i


@dataclass(frozen=True)
class SleepAt:
    index: int
    seconds: float

    def __call__(self, i: Any) -> Any:
        if i == self.index:
            time.sleep(self.seconds)
        return i


@dataclass(frozen=True)
class Sleepy:
    """Sleep *seconds*, then call *fn*: every item takes a while (a fault injector among
    items that take time, say)."""

    fn: Any
    seconds: float

    def __call__(self, i: Any) -> Any:
        time.sleep(self.seconds)
        return self.fn(i)


class Unrebuildable(Exception):
    """An exception whose constructor needs two arguments: it can't be unpickled."""

    def __init__(self, a: Any, b: Any) -> None:
        super().__init__(f"{a}/{b}")


@dataclass(frozen=True)
class RaiseUnrebuildable:
    def __call__(self, i: Any) -> Any:
        raise Unrebuildable(i, "x")


def square(x: int) -> int:
    return x * x


def pid_and(x: Any) -> tuple[Any, int]:
    return x, os.getpid()


@dataclass(frozen=True)
class DieAt:
    """Kill the worker that reads one of *deaths*' sample indices, keyed by index.

    Each death is ``(index, how, times)``: *how* is ``"exit"`` (``os._exit(3)``) or
    ``"kill"`` (SIGKILL); the first *times* reads of *index* die and later ones go on (so a
    new worker delivers it, or, read twice, it is a poison sample). The reads are counted as
    files in *folder*, so the count holds across worker processes.
    """

    deaths: tuple[tuple[int, str, int], ...]
    folder: str

    def __call__(self, i: Any) -> Any:
        for index, how, times in self.deaths:
            if i == index:
                done = [f for f in os.listdir(self.folder) if f.startswith(f"{index}-")]
                if len(done) < times:
                    with open(os.path.join(self.folder, f"{index}-{len(done)}"), "w"):
                        pass
                    if how == "kill":
                        os.kill(os.getpid(), signal.SIGKILL)
                        time.sleep(10)
                    os._exit(3)
        return i


@dataclass(frozen=True)
class Samples:
    """A map-style dataset of ``n`` samples whose ``__getitem__`` is *fn* (a fault)."""

    n: int
    fn: Any

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return self.fn(i)


@dataclass(frozen=True)
class Share:
    """An iterable over ``range(n)`` that splits itself by worker (its worker's share)."""

    n: int

    def __iter__(self) -> Any:
        from pipeflow import get_worker_info

        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, self.n, step))
