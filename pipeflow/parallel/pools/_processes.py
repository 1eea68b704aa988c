"""Worker processes, each with its own duplex pipe; results come back through shared memory.

Workers start when first given a task (the first at once, the others when the consumer waits
anyway, so that a fork never holds back a result that is there), get tasks round-robin
(torch's order) or by least load, and answer with
:class:`~pipeflow.parallel.transport._wire.Reply` records whose large buffers travel in
shared memory (:mod:`pipeflow.parallel.transport._shm`: its ``Writer`` there, its ``Reader``
here). A worker that dies is named, with its pid, exit code or signal and the sample indices
it held.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import select
import signal
import time
from typing import Any

from pipeflow._spawning import death_hint, refuse_nested, started_from, stop_if_importing_main
from pipeflow.errors import WorkerDiedError
from pipeflow.parallel.pools._fork import Freeze, prepared
from pipeflow.parallel.pools._lives import Lives
from pipeflow.parallel.pools._protocol import LIVE, STOP_GRACE, TakingTurns, held
from pipeflow.parallel.pools._reap import in_background
from pipeflow.parallel.pools._worker import WorkerSpec, process_main
from pipeflow.parallel.transport import _segments
from pipeflow.parallel.transport._shm import Reader
from pipeflow.parallel.transport._wire import Encoded, Reply, Task, Trim, raise_remote

__all__ = ["ProcessPool"]

_POOL_IDS = itertools.count()
#: A worker's reply stamps when it was done with its item (``Reply.ended``); it is free for
#: its next one as soon as the reply is in the pipe, unless the pipe was too full to take it
#: (this process did not read it while the consumer held results), and the send waited. That
#: can't happen while the pipe holds at most these many bytes (a socket buffer holds 8 KiB
#: on macOS, about 200 KiB on Linux); a reply is a few hundred bytes, unless its results
#: come through the pipe (``/dev/shm`` full) or its state for ``state_dict()`` is large.
_TRUSTED_BYTES = 4096
log = logging.getLogger("pipeflow")


def _readable(conn: Any) -> bool:
    """``conn.poll()`` at a fraction of its cost: that builds a selector per call (~25 us),
    which adds up when a worker sends thousands of small replies a second (coroutines)."""
    return bool(select.select((conn,), (), (), 0)[0])


def _replies(msg: bytes) -> list[Reply]:
    """A worker's message: one reply, or a list of them (a coroutine worker's loop sends all
    the replies of one turn together)."""
    loaded = pickle.loads(msg)
    return loaded if isinstance(loaded, list) else [loaded]


class ProcessPool(TakingTurns):
    """Worker processes, each with its own duplex pipe; results come back via shared memory."""

    backend = "process"
    trims = True  # end_pass gives back the shared memory kept for reuse
    resizable = True  # workers="auto": see resize()

    def __init__(
        self,
        spec: WorkerSpec,
        *,
        name: str,
        round_robin: bool,
        context: multiprocessing.context.BaseContext,
        target: Any = process_main,
        concurrent: bool = False,
        restarts: int = 0,
    ) -> None:
        """*spec* is what each worker starts with (its id and segment prefix set per worker);
        *target* is the workers' main function, called as ``target(conn, spec)``;
        *concurrent*: each worker runs many tasks at once (event loops), so it gets its full
        share of ``max_in_flight`` from the start and is never taken for stuck behind a slow
        task; *restarts*: how many dead workers a pass may replace (see :meth:`_died`)."""
        refuse_nested(name)  # a worker process may not have children
        stop_if_importing_main(name)  # a spawned worker running the script's top level
        self.started = started_from()  # the script's line, for death_hint
        workers = spec.num_workers
        self.target = target
        self.concurrent = concurrent
        self.name = name
        self.workers = workers
        self.round_robin = round_robin
        self.pool_id = next(_POOL_IDS)
        self.prefix = _segments.segment_prefix(os.getpid(), self.pool_id)
        self.method = context.get_start_method()
        self.closed = False
        self.broken = False
        # Leave the Process objects open at close (usable: pid, join, exitcode) for whoever
        # holds them (pf.DataLoader's `_workers`); their fds then close when they are freed.
        self.keep_processes = False
        self.freeze = Freeze()
        self._dispatch_state(workers)
        self.context = context
        self.spec = prepared(spec, self.method, name)._replace(main_pid=os.getpid())
        self.conns: list[Any] = [None] * workers
        self.procs: list[Any] = [None] * workers
        self.by_fd: dict[int, int] = {}
        self.sentinels: dict[int, int] = {}
        self.reader = Reader()
        self.unsent: list[list[Task]] = [[] for _ in range(workers)]  # concurrent: one send
        self.lives = Lives(workers, restarts, self.prefix, concurrent)
        self.piped = False  # a result came through the pipe: /dev/shm was full (warned once)
        self.epoch = 0  # the epoch of the items sent in this pass
        LIVE.add(self)

    def _dispatch_state(self, workers: int) -> None:
        """What the dispatch of tasks to *workers* keeps: turns, queues, timings, lazy starts."""
        self.pass_id = 0
        self.active = [True] * workers
        self.outstanding: list[dict[int, Any]] = [{} for _ in range(workers)]
        self.stale: list[int] = [0] * workers  # tasks of earlier passes still out
        self.depth = 2  # tasks queued per worker, at most (set per pass)
        # When each worker was sent each task it has not answered yet (any pass's), by
        # (pass, seq), in the order sent; and when it was done with its last one (its
        # reply's end, or when that was read): together, since when it holds an item
        # (see busy_since).
        self.sent_at: list[dict[tuple[int | None, int], float]] = [{} for _ in range(workers)]
        self.free_since = [0.0] * workers
        self.emptied = [0.0] * workers  # when each worker's pipe was last found empty
        self.avg: float | None = None  # moving average of the time per task
        self.warm = [False] * workers  # a worker's first result also timed its start-up
        self.rr_next = 0  # round robin: the worker the next task goes to
        self.limit = workers  # workers="auto": the workers given tasks are those below it
        # Round robin out of order (torch's in_order=False): a worker whose queue is full is
        # passed over, so a worker stuck on a slow item is not given more (set by make_pool).
        self.skip_full = False
        # Tasks for workers not started yet: the first worker starts at once, the others
        # when this process would wait for results anyway (see collect()).
        self.to_start: dict[int, list[Task]] = {}
        self.hold_until = 0.0  # until then, the first worker's first result goes first

    def _start(self, wid: int) -> None:
        """Start worker *wid*. Workers start when first given a task, so the first one is
        already working while the next one forks."""
        prefix = _segments.segment_prefix(self.spec.main_pid, self.pool_id, self.lives.name(wid))
        # a resumed pass restores each worker's state in its first life; a replacement worker
        # (after a death) starts as the dead one's seed and id say
        first = not self.lives.lives[wid]
        restore = self.spec.restore[wid] if self.spec.restore and first else None
        spec = self.spec._replace(worker_id=wid, prefix=prefix, restore=restore)
        here, there = self.context.Pipe(duplex=True)
        proc = self.context.Process(  # type: ignore[attr-defined]
            target=self.target,
            args=(there, spec),
            name=f"pipeflow-{self.name}-{wid}",
            daemon=True,
        )
        if self.method == "fork":
            self.freeze.hold()
        began = time.monotonic()
        try:
            with _segments.not_inherited(self.method):
                proc.start()
        finally:
            there.close()
        if not self.by_fd:  # the pool's first worker: the others may start a fork later
            now = time.monotonic()
            self.hold_until = now + (now - began)
        self.conns[wid], self.procs[wid] = here, proc
        self.by_fd[here.fileno()] = wid
        self.sentinels[proc.sentinel] = wid

    # -- a pass ----------------------------------------------------------------------------
    def start_pass(self, max_in_flight: int) -> None:
        self.pass_id += 1
        self.active = [True] * self.workers
        self.rr_next = 0  # every pass starts at worker 0, as torch's iterators do
        self.depth = -(-max_in_flight // self.limit)
        for wid, waiting in self.to_start.items():  # an abandoned pass's: never sent
            for task in waiting:
                self.outstanding[wid].pop(task.seq, None)
        self.to_start.clear()
        for wid in range(self.workers):
            self.stale[wid] += len(self.outstanding[wid])
            self.outstanding[wid].clear()
        self._replace_the_dead()
        self.lives.start_pass(self.reader)

    def end_pass(self) -> None:
        """A kept pool sat idle after a pass: every worker drops its kept segments, and so
        does the reader, so that ``/dev/shm`` holds nothing of the pool's until the next."""
        for conn in self.conns:
            if conn is not None:
                with contextlib.suppress(OSError, ValueError):  # dead: the next pass sees it
                    conn.send([Trim(self.pass_id)] if self.concurrent else Trim(self.pass_id))
        self.reader.trim()

    def submit(self, seq: int, epoch: int, item: Any) -> bool:
        """Send one task; False (nothing sent) when no worker has room for it now."""
        wid = self._choose()
        if wid is None:
            return False
        later = False  # the worker starts when this process would wait anyway: collect()
        if self.procs[wid] is None:
            later = wid in self.to_start or bool(self.by_fd)
            if not later:
                self._start(wid)  # the pool's first worker
        self.epoch = epoch
        freed = self.reader.take_freed(self.lives.keys[wid])  # segments it may write again
        task = Task(self.pass_id, seq, epoch, item, freed)
        self.outstanding[wid][seq] = item
        if later:
            self.to_start.setdefault(wid, []).append(task)
            return True
        if self.concurrent:  # an event loop takes many: sent together, by collect()
            self.unsent[wid].append(task)
            return True
        try:  # noqa: SIM105 - per item: a try costs less than a suppress() block
            self.conns[wid].send(task)
        except OSError:  # BrokenPipeError: the worker is gone (collect() sees its sentinel)
            pass
        self.sent_at[wid][self.pass_id, seq] = time.monotonic()
        return True

    def submit_many(self, items: list[tuple[int, Any]], epoch: int) -> int:
        """Send ``(seq, item)`` pairs in turn, until no worker has room; how many went."""
        submit = self.submit
        for sent, (seq, item) in enumerate(items):
            if not submit(seq, epoch, item):
                return sent
        return len(items)

    def _ready(self, deadline: float | None) -> list[Any]:
        """The pipes and sentinels ready by *deadline* (``None``: no limit; ``[]``: none).

        Meanwhile the workers with tasks waiting start, one at a time, only while nothing is
        there to read: a fork holds this process for ~10 ms (more with a large heap). Until
        the first worker's first result, the next fork waits as long as the first fork took:
        a short first item (time to the first batch) is then not held back by it, and a long
        one does not hold back the other workers (the second batch) more than that."""
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            waitables = [*self.by_fd_conns(), *self.sentinels]
            if not self.to_start:
                return multiprocessing.connection.wait(waitables, left)
            hold = 0.0 if any(self.warm) else max(0.0, self.hold_until - time.monotonic())
            ready = multiprocessing.connection.wait(
                waitables, hold if left is None else min(hold, left)
            )
            if ready or left == 0.0:
                return ready
            if hold <= (left if left is not None else hold):
                self._start_waiting()

    def _start_waiting(self) -> None:
        """Start one worker that has tasks waiting for it, and send them."""
        wid = next(iter(self.to_start))
        tasks = self.to_start.pop(wid)
        self._start(wid)
        self._send(wid, tasks)

    def _send(self, wid: int, tasks: list[Task]) -> None:
        """Send *tasks* to worker *wid*: in one message to an event loop, else one by one."""
        with contextlib.suppress(OSError):  # the worker is gone: collect() sees it
            if self.concurrent:
                self.conns[wid].send(tasks)
            else:
                for task in tasks:
                    self.conns[wid].send(task)
        now = time.monotonic()
        self.sent_at[wid].update({(task.pass_id, task.seq): now for task in tasks})

    def _send_unsent(self) -> None:
        for wid in [w for w, tasks in enumerate(self.unsent) if tasks]:
            tasks, self.unsent[wid] = self.unsent[wid], []
            self._send(wid, tasks)

    def _choose(self) -> int | None:
        if self.round_robin:  # torch's order: task k to worker k % workers
            for _ in range(self.workers):
                wid = self.rr_next
                if self.active[wid]:
                    self.rr_next = (wid + 1) % self.workers
                    if self.skip_full and len(self.outstanding[wid]) >= self.depth:
                        continue  # out of order, as torch: a worker with no room is passed
                    return wid
                self.rr_next = (wid + 1) % self.workers
            if self.skip_full:
                return None
            raise AssertionError("no active worker")
        # The least busy worker, never one that seems stuck on a slow item: queueing behind
        # it would hold the queued item back too. Until the first result shows how long an
        # item takes, one task per worker.
        now = time.monotonic()
        cap = 1 if self.avg is None and not self.concurrent else self.depth
        slow = None if self.avg is None or self.concurrent else max(4 * self.avg, 0.001)
        best = cap
        choice = None
        for wid in range(self.limit):
            load = len(self.outstanding[wid]) + self.stale[wid]
            if load >= best:
                continue
            if slow is not None and load > 0 and now - (self._since(wid) or now) > slow:
                continue  # stuck: let its queue drain first (an idle worker is never stuck)
            best, choice = load, wid
        return choice

    def collect(self, timeout: float | None) -> list[Reply] | None:
        """Wait for messages (or a death); ``None`` means *timeout* passed with none.

        The list may be empty when only late results of an abandoned pass arrived.
        """
        self._send_unsent()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ready = self._ready(deadline)
            if not ready:
                return None
            out: list[Reply] = []
            dead: list[int] = []
            got = False
            for r in ready:
                if isinstance(r, int):
                    dead.append(self.sentinels[r])
                    continue
                assert isinstance(r, multiprocessing.connection.Connection)
                wid = self.by_fd[r.fileno()]
                size = 0  # the bytes read from this pipe since it was last found empty
                while True:
                    try:
                        if not _readable(r):
                            self.emptied[wid] = time.monotonic()
                            break
                        msg = r.recv_bytes()
                    except (EOFError, OSError):  # the pipe closed: the worker is gone
                        dead.append(wid)
                        break
                    got = True
                    size += len(msg)
                    # Outside the try: a worker_init that raised an OSError (a missing file)
                    # is re-raised here, and must not read as a closed pipe.
                    for reply in _replies(msg):
                        res = self._receive(wid, reply, size)
                        if res is not None:
                            out.append(res)
            if got:
                if self.limit < self.workers:  # workers="auto" went down: they may leave now
                    self._retire_idle()
                return out  # deliver what came first; a death shows up on the next call
            for wid in dict.fromkeys(dead):  # its pipe and its sentinel: one death
                out.extend(self._died(wid))
            if out:
                return out

    def resize(self, count: int, in_flight: int) -> None:
        """Give tasks to workers ``0 .. count - 1`` from now on (``workers="auto"``): one
        not started yet starts with its first task; one above them leaves once it has
        answered every task it holds (:meth:`_retire_idle`)."""
        self.limit = count
        self.depth = -(-in_flight // count)
        self._retire_idle()

    def answered(self, count: int) -> bool:
        """Whether workers ``0 .. count - 1`` have each sent a reply since they started."""
        return all(self.warm[:count])

    def live(self) -> int:
        """How many worker processes run now (those above the limit still finishing too)."""
        return sum(proc is not None for proc in self.procs)

    def _retire_idle(self) -> None:
        """Stop the workers above the limit that hold no task, and wait for their exit: the
        budget counts a process until it has exited."""
        for wid in range(self.limit, self.workers):
            if self.procs[wid] is None or self.outstanding[wid] or self.stale[wid]:
                continue
            if wid in self.to_start or self.unsent[wid]:
                continue
            proc = self.procs[wid]
            with contextlib.suppress(OSError, ValueError):
                self.conns[wid].send(None)
            _wait_gone([proc], STOP_GRACE)
            self._last_words(wid)
            self._forget(wid)

    def by_fd_conns(self) -> list[Any]:
        return [c for c in self.conns if c is not None]

    def _receive(self, wid: int, reply: Reply, size: int | None = None) -> Reply | None:
        """Take worker *wid*'s *reply*, read from its pipe after *size* bytes since the pipe
        was last found empty (``None``: read otherwise); ``None`` if it is not this pass's."""
        if reply.kind == "init":
            raise_remote(reply.payload, f"worker_init in worker {wid} (pid {self.procs[wid].pid})")
        began = self._since(wid)
        self.sent_at[wid].pop((reply.pass_id, reply.seq), None)
        end = self._free_from(wid, reply, size)
        if self.warm[wid] and began is not None:
            took = end - began
            self.avg = took if self.avg is None else 0.8 * self.avg + 0.2 * took
        self.warm[wid] = True
        self.free_since[wid] = end
        if self.lives.keys[wid] != wid:  # a replacement worker: its segments are its own
            reply = reply._replace(worker=self.lives.keys[wid])
        if reply.kind == "ok" and reply.payload.retired:
            self.reader.retire(reply.worker, reply.payload.retired)
        if reply.pass_id != self.pass_id:  # a late result of an abandoned pass
            self.stale[wid] -= 1
            if reply.kind == "ok" and reply.payload.segment is not None:
                _segments.discard(reply.payload.segment.name)  # its worker trimmed it
            return None
        self.outstanding[wid].pop(reply.seq, None)
        if reply.kind == "end":
            self.active[wid] = False
        return reply

    # -- since when a worker holds an item ----------------------------------------------------
    def busy_since(self) -> float | None:
        """When the item held longest by a worker now started (``None``: none holds one).

        A worker that runs its tasks one at a time holds the oldest it has not answered: since
        it was sent, or since the worker was done with the one before, whichever came later
        (a task queued behind another is not held yet). An event loop holds every task it
        was sent, each since it was sent. Tasks waiting here for their worker to start are
        not held."""
        starts = [since for wid in range(self.workers) if (since := self._since(wid)) is not None]
        return min(starts, default=None)

    def _since(self, wid: int) -> float | None:
        """Since when worker *wid* holds an item (``None``: it holds none)."""
        sent = self.sent_at[wid]
        if not sent:
            return None
        first = next(iter(sent.values()))  # the oldest: in the order sent
        return first if self.concurrent else max(first, self.free_since[wid])

    def _free_from(self, wid: int, reply: Reply, size: int | None) -> float:
        """When worker *wid* was free for its next task, as its *reply* (read after *size*
        bytes of its pipe) shows: the end the worker stamped on it (``Reply.ended``), which
        holds even when the reply waited in the pipe while the consumer held results; but
        only if its send can't have waited for this process to read the pipe (it was small,
        written after the pipe was last found empty, see :data:`_TRUSTED_BYTES`). Else now,
        as it is read: the worker was free no later, so a timeout never comes early."""
        now = time.monotonic()
        ended = reply.ended
        if size is not None and size <= _TRUSTED_BYTES and self.emptied[wid] < ended <= now:
            return ended
        return now

    def value(self, reply: Reply) -> Any:
        if reply.kind == "err":
            raise_remote(reply.payload, None)
        encoded: Encoded = reply.payload
        if encoded.piped and not self.piped:
            self.piped = True
            log.warning(
                "pipeflow: parallel stage %r: %s is full, so results now come through the "
                "pipe (slower); enlarge it (for Docker: docker run --shm-size=8g), or lower "
                "max_in_flight or the batch size",
                self.name,
                _segments.SHM_DIR,
            )
        return self.reader.decode(reply.worker, encoded.data, encoded.segment, encoded.layout)

    def drop(self, reply: Reply) -> None:
        if reply.kind == "ok":
            self.reader.discard(reply.worker, reply.payload.segment)

    # -- a worker's death ---------------------------------------------------------------------
    def _died(self, wid: int) -> list[Reply]:
        """Worker *wid* is gone. Within the pass's restarts, a new worker takes its place and
        its items (the replies it sent before dying are returned, to deliver); else, or when
        one sample was being worked on at two deaths, raise :class:`WorkerDiedError`."""
        last = self._last_words(wid)
        proc = self.procs[wid]
        proc.join(0.1)
        code = proc.exitcode
        what = f"{_how(code)} while holding {held(self.outstanding[wid])}"
        death = f"worker {wid} of {self.workers} (pid {proc.pid}) {what}"
        poison = self.lives.poison(self.outstanding[wid], f"pid {proc.pid} {_how(code)}")
        if poison is None and self.lives.may_restart():
            log.warning(
                "pipeflow: parallel stage %r: %s; a new worker takes its place and its "
                "items (restart %d of %d this epoch)",
                self.name,
                death,
                self.lives.used,
                self.lives.restarts,
            )
            self._replace(wid)
            return last
        self.broken = True
        msg = f"parallel stage {self.name!r}: {poison or death}"
        if poison is not None:
            msg += f"; {death}"
        elif self.lives.restarts:
            msg += f"; restarts={self.lives.restarts} were spent this epoch"
        fix = ""
        if not self.warm[wid] and code is not None and code > 0:  # died while starting
            fix = death_hint(self.method, self.started)
        if code == -signal.SIGBUS:
            fix = (
                "; SIGBUS in a worker usually means /dev/shm is full: enlarge it (e.g. "
                "docker run --shm-size=8g) or lower max_in_flight"
            )
        error = WorkerDiedError(msg + fix, pid=proc.pid, exitcode=code)
        error.fix = fix  # the pass adds what it lost before it
        error.worker = wid  # parallel_source names where the worker stood in its stream
        raise error

    def _last_words(self, wid: int) -> list[Reply]:
        """What a dead worker sent that was not read yet: its replies (delivered as any
        other), or a start-up failure, which explains the death and is raised."""
        out: list[Reply] = []
        conn = self.conns[wid]
        with contextlib.suppress(EOFError, OSError):
            while conn.poll():
                for reply in _replies(conn.recv_bytes()):
                    if reply.kind == "init":
                        where = f"worker_init in worker {wid} (pid {self.procs[wid].pid})"
                        raise_remote(reply.payload, where)
                    got = self._receive(wid, reply)
                    if got is not None:
                        out.append(got)
        return out

    def _replace(self, wid: int) -> None:
        """Start a new worker in dead worker *wid*'s place and send it the dead one's items
        again, in the order they were sent (the one it was working on first)."""
        held = self.outstanding[wid]
        self._forget(wid)
        self._start(wid)
        tasks = [Task(self.pass_id, seq, self.epoch, item, None) for seq, item in held.items()]
        self._send(wid, tasks)

    def _forget(self, wid: int) -> None:
        """Let go of dead worker *wid*: its pipe, its sentinel, its segments' names (a new
        worker in its place gets new ones)."""
        conn, proc = self.conns[wid], self.procs[wid]
        self.by_fd.pop(conn.fileno(), None)
        self.sentinels.pop(proc.sentinel, None)
        conn.close()
        if proc.is_alive():  # it closed its pipe but runs on: it can't be told anything
            proc.kill()
            proc.join(1.0)
        if not self.keep_processes:
            with contextlib.suppress(ValueError):  # still running after all: the OS reaps it
                proc.close()
        self.conns[wid] = self.procs[wid] = None
        self.stale[wid] = 0
        self.sent_at[wid], self.free_since[wid], self.emptied[wid] = {}, 0.0, 0.0
        self.warm[wid] = False
        self.unsent[wid] = []
        self.lives.next_life(wid)

    def _replace_the_dead(self) -> None:
        """Between passes: a worker that died since (killed while idle) is let go, and a new
        one starts when it is given its first item. Nothing was lost: no restart is used."""
        for wid, proc in enumerate(self.procs):
            if proc is not None and (not proc.is_alive() or _exiting(proc.pid)):
                proc.join(1.0)  # a process ends when its last thread has: a moment more
                log.warning(
                    "pipeflow: parallel stage %r: worker %d of %d (pid %d) %s between "
                    "passes; a new worker takes its place",
                    self.name,
                    wid,
                    self.workers,
                    proc.pid,
                    _how(proc.exitcode),
                )
                self._last_words(wid)
                self._forget(wid)

    def in_flight(self) -> str:
        parts = [
            f"{held(o)} in worker {w} (pid {self.procs[w].pid})"
            for w, o in enumerate(self.outstanding)
            if o and self.procs[w] is not None
        ]
        return "; ".join(parts) or "nothing"

    # -- shutdown ---------------------------------------------------------------------------
    def close(self) -> None:
        """Tell every worker to stop and return; a background thread joins them (terminating
        the hung ones) and unlinks every segment (:func:`_reap`). The last ``next()`` of a
        pass so returns as soon as its item is there, not after the workers' exit. A broken
        pool (a death, a timeout), event loops' workers and workers whose Process objects are
        handed out (``keep_processes``) are stopped here."""
        if self.closed:
            return
        self.closed = True
        LIVE.discard(self)
        conns = [c for c in self.conns if c is not None]
        procs = [p for p in self.procs if p is not None]
        self.reader.close()
        self.freeze.release()
        # A pass that failed (a death, a timeout) ends at once: no grace for a worker that
        # may be stuck (a timeout) or frozen (SIGSTOP, which only SIGKILL ends).
        grace = 0.0 if self.broken else STOP_GRACE
        args = (procs, conns, grace, self.broken, self.keep_processes, self.prefix)
        # Here, not in the background: a broken pool is killed before its error goes on; an
        # event loop's coroutines in flight are cancelled, their `finally` blocks run, before
        # the consumer's `break` returns (what remote-data.md promises).
        # And pf.DataLoader's workers, whose Process objects its iterator hands out
        # (`_workers`): whoever joins one must not race the reaper's join of it.
        if self.broken or self.concurrent or self.keep_processes:
            _reap(*args)
        else:
            in_background(lambda: _reap(*args))


def _reap(
    procs: list[Any], conns: list[Any], grace: float, broken: bool, keep: bool, prefix: str
) -> None:
    """Tell the workers to stop, wait for them: *grace* seconds, then terminate (kill when
    *broken*), then kill; read what they sent last (its segments unlinked), close their pipes
    and, unless *keep*, their Process objects; unlink whatever segment under *prefix* is left.

    It waits on the processes' sentinels and reaps them (``join``) only once they ended."""
    for c in conns:
        with contextlib.suppress(OSError, ValueError):
            c.send(None)
    _wait_gone(procs, grace)
    for p in _running(procs):
        p.kill() if broken else p.terminate()
    _wait_gone(procs, 0.3)
    for p in _running(procs):
        p.kill()
    _wait_gone(procs, 0.3)
    for c in conns:
        try:
            while c.poll():
                for reply in _replies(c.recv_bytes()):
                    if reply.kind == "ok" and reply.payload.segment is not None:
                        _segments.discard(reply.payload.segment.name)
        except (EOFError, OSError):
            pass
        c.close()
    for p in procs:
        p.join(1.0)  # ended, or killed above
        if not keep:
            with contextlib.suppress(ValueError):  # another thread's poll reaped it first
                p.close()
    _segments.sweep(prefix)


def _running(procs: list[Any]) -> list[Any]:
    """The processes of *procs* whose sentinel is not ready (still running)."""
    ended = set(multiprocessing.connection.wait([p.sentinel for p in procs], 0))
    return [p for p in procs if p.sentinel not in ended]


def _wait_gone(procs: list[Any], timeout: float) -> None:
    """Wait up to *timeout* seconds for every process of *procs* to end."""
    deadline = time.monotonic() + timeout
    while (running := _running(procs)) and (left := deadline - time.monotonic()) > 0:
        multiprocessing.connection.wait([p.sentinel for p in running], left)


def _exiting(pid: int) -> bool:
    """Whether process *pid*'s main thread has ended (Linux: it shows as a zombie while its
    other threads end; ``waitpid`` reports the process only after them)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def _how(code: int | None) -> str:
    """How a worker ended, from its exit code (negative: the signal)."""
    if code is None:
        return "closed its pipe"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
