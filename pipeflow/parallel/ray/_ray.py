"""Ray actors as a pool's workers (``backend="ray"``): a pipeline's heavy stage on a cluster.

Each worker is an actor (:class:`~pipeflow.parallel.ray._ray_worker.RayWorker`) made when
the pool is, spread over the cluster's nodes; it holds the job and its ``worker_init`` for
the pool's life, as a persistent worker process does. Items go to the actors in *calls* of
several (up to half an actor's share of ``max_in_flight``, so that each actor has a second
call queued as it ends one), since a call costs up to a millisecond whatever it carries;
each call answers with one :class:`~pipeflow.parallel.transport._wire.Reply` per item,
through Ray's object store (:mod:`._ray_wire`).

An actor that dies (``ray.kill``, a crash, its node gone) is found when its call fails. Its
items (those it was sent and had not answered) go to a new actor in its place, with its id and
seed, within the pass's ``restarts`` (counted as :class:`~pipeflow.parallel.pools._lives.Lives`
counts a process pool's); past them, or for a sample at two deaths, the pass ends with a
:class:`~pipeflow.WorkerDiedError` naming the actor, its pid, its node, Ray's reason and the
items. Every item is delivered once: a call's replies are taken whole or not at all, and the
calls of a replaced actor are forgotten.

Connecting follows Ray's conventions: a Ray already started (``ray.init(address=...)``) is
used; else ``ray.init()`` connects to ``RAY_ADDRESS`` or starts a local instance.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import time
from typing import Any, NamedTuple

try:
    import ray
except ModuleNotFoundError:  # pragma: no cover - a stage is refused when built without Ray;
    ray = None  # type: ignore[assignment]  # this keeps the module importable (its doctests)

from pipeflow.errors import WorkerDiedError
from pipeflow.parallel.pools._lives import Lives
from pipeflow.parallel.pools._protocol import LIVE, STOP_GRACE, TakingTurns, held
from pipeflow.parallel.pools._worker import WorkerSpec
from pipeflow.parallel.ray._ray_options import actor_options
from pipeflow.parallel.ray._ray_wire import unpack
from pipeflow.parallel.ray._ray_worker import RayWorker, node_words
from pipeflow.parallel.transport._wire import Reply, raise_remote

__all__ = ["RayPool", "connect", "free_actors", "ray_pool"]

log = logging.getLogger("pipeflow")
_POOL_IDS = itertools.count()
_ACTOR: list[Any] = []  # the actor class, made once per process by ray.remote


def connect() -> None:
    """Use the Ray this process is connected to, or connect as Ray's conventions say."""
    if not ray.is_initialized():
        ray.init()  # RAY_ADDRESS, a cluster started with `ray start` here, or a new local one


def _actor_class() -> Any:
    if not _ACTOR:
        _ACTOR.append(ray.remote(RayWorker))
    return _ACTOR[0]


class _Call(NamedTuple):
    """A call in flight: the actor's id and life, the pass, the items' numbers, and when it
    was sent (``time.monotonic()``)."""

    worker: int
    life: int
    pass_id: int
    seqs: list[int]
    sent: float


class RayPool(TakingTurns):
    """Ray actors, one per worker, fed items in calls (see the module's text)."""

    backend = "ray"
    worker_kind = "ray actor"

    def __init__(
        self,
        spec: WorkerSpec,
        *,
        name: str,
        round_robin: bool,
        options: dict[str, Any] | None = None,
        restarts: int = 0,
    ) -> None:
        """*spec*: what each actor starts with (its id set per actor); *options*: Ray's
        options for each actor (``ray_options``); *restarts*: how many dead actors a pass may
        replace."""
        connect()
        workers = spec.num_workers
        self.name, self.workers, self.round_robin = name, workers, round_robin
        self.closed = self.broken = False
        self.key = f"{os.getpid()}-{next(_POOL_IDS)}"
        self.options = actor_options(options)
        self.spec = spec._replace(job=None, worker_init=None)
        self.work = ray.put(_pickled(spec, name))  # once, for every actor
        self.lives = Lives(workers, restarts, "")
        self.pass_id = 0
        self.epoch = 0
        self.depth = self.per_call = 1  # items out per actor, items per call (set per pass)
        self.active = [True] * workers
        self.outstanding: list[dict[int, Any]] = [{} for _ in range(workers)]
        self.unsent: list[list[tuple[int, Any]]] = [[] for _ in range(workers)]
        self.calls: dict[Any, _Call] = {}  # ObjectRef -> the call it answers, in order sent
        self.answered = [0.0] * workers  # when each actor's last answer was read here
        self.timeout: float | None = None  # the stage's (see busy_since)
        self.rr_next = 0  # round robin: the actor the next item goes to
        self.skip_full = False  # round robin out of order: a full actor is passed over
        self.filling: int | None = None  # least load: the actor a run of items goes to
        self.actors: list[Any] = [None] * workers
        self.places: list[Any] = [None] * workers  # (pid, address, node id), or its ref
        _check_fits(name, workers, self.options, round_robin)
        LIVE.add(self)
        for wid in range(workers):
            self._start(wid)

    def _start(self, wid: int) -> None:
        """Make actor *wid* (a resumed pass's state goes to its first life only)."""
        first = not self.lives.lives[wid]
        restore = self.spec.restore[wid] if self.spec.restore and first else None
        spec = self.spec._replace(worker_id=wid, restore=restore)
        label = f"pipeflow/{self.name}/{self.key}/{self.lives.name(wid)}"
        actor = _actor_class().options(name=label, **self.options).remote(self.work, spec)
        self.actors[wid] = actor
        self.places[wid] = actor.place.remote()

    # -- a pass ----------------------------------------------------------------------------
    def start_pass(self, max_in_flight: int) -> None:
        self.pass_id += 1
        self.active = [True] * self.workers
        self.rr_next, self.filling = 0, None
        self.depth = -(-max_in_flight // self.workers)
        self.per_call = max(1, -(-self.depth // 2))
        for ref in self.calls:  # an abandoned pass's: queued ones never run
            with contextlib.suppress(Exception):
                ray.cancel(ref)
        self.calls.clear()
        for wid in range(self.workers):
            self.outstanding[wid].clear()
            self.unsent[wid].clear()
        if self.pass_id > 1:
            self._replace_the_dead()
        self.lives.start_pass()

    def submit(self, seq: int, epoch: int, item: Any) -> bool:
        """Queue one item for an actor with room (sent by :meth:`collect`, in calls)."""
        wid = self._choose_rr() if self.round_robin else self._choose()
        if wid is None:
            return False
        self.epoch = epoch
        self.outstanding[wid][seq] = item
        self.unsent[wid].append((seq, item))
        return True

    def _choose_rr(self) -> int | None:
        """Item k to actor k % workers; when its share is out, wait (in order) or pass it
        over (out of order, as torch's ``in_order=False``)."""
        for _ in range(self.workers):
            wid = self.rr_next
            self.rr_next = (wid + 1) % self.workers
            if not self.active[wid]:
                continue
            if len(self.outstanding[wid]) < self.depth:
                return wid
            if not self.skip_full:
                self.rr_next = wid
                return None
        return None

    def _choose(self) -> int | None:
        """The least loaded actor, given a run of items (a call's worth) at a time."""
        wid = self.filling
        if (
            wid is not None
            and len(self.unsent[wid]) % self.per_call
            and len(self.outstanding[wid]) < self.depth
        ):
            return wid
        best, choice = self.depth, None
        for wid, items in enumerate(self.outstanding):
            if len(items) < best and self.active[wid] and self._started(wid):
                best, choice = len(items), wid
        self.filling = choice
        return choice

    def _started(self, wid: int) -> bool:
        """Whether actor *wid* runs (it has said where): an actor the cluster has no room
        for yet gets no items (least load), so they never wait for room that may not come."""
        return isinstance(self.places[wid], tuple)

    def _waiting_places(self) -> dict[Any, int]:
        """The actors that have not said where they run yet, by the reference of the answer."""
        return {p: wid for wid, p in enumerate(self.places) if not isinstance(p, tuple)}

    def _note_places(self, refs: list[Any]) -> None:
        """Take the answers of actors that started (they get items from now on)."""
        waiting = self._waiting_places()
        for ref in refs:
            wid = waiting.get(ref)
            if wid is not None:
                with contextlib.suppress(Exception):  # a death shows on its calls
                    self.places[wid] = ray.get(ref)

    def _send(self) -> None:
        """Send the queued items, in calls of up to ``per_call``."""
        for wid, queued in enumerate(self.unsent):
            if not queued:
                continue
            life, run = self.lives.lives[wid], self.actors[wid].run
            for k in range(0, len(queued), self.per_call):
                chunk = queued[k : k + self.per_call]
                ref = run.remote(self.pass_id, self.epoch, chunk)
                seqs = [seq for seq, _ in chunk]
                self.calls[ref] = _Call(wid, life, self.pass_id, seqs, time.monotonic())
            self.unsent[wid] = []

    def collect(self, timeout: float | None) -> list[Reply] | None:
        """Send what is queued; wait for calls to answer (``None``: none within *timeout*).
        The list may be empty when the calls that answered were a dead actor's."""
        self._send()
        # Actors not started yet (no room in the cluster) join as they start: their
        # answer wakes this wait, and the next items go to them too.
        waiting = [] if self.round_robin else list(self._waiting_places())
        if not self.calls and not waiting:
            return []
        refs = [*self.calls, *waiting]
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if not ready:
            return None
        if len(refs) > 1:  # and every other one that has answered by now
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        self._note_places(ready)
        out: list[Reply] = []
        now = time.monotonic()
        for ref in ready:
            if ref in self.calls:  # (not a call of an actor replaced meanwhile)
                call = self.calls.pop(ref)
                self.answered[call.worker] = now
                out.extend(self._answer(ref, call))
        return out

    def busy_since(self) -> float | None:
        """When the item an actor has held longest began, as far as this process can tell
        (``None``: no call is out).

        An actor runs its calls in the order sent, and answers each whole: the call it runs
        began when it was sent or when its answer to the one before was read here, whichever
        came later (its own clock is another machine's, maybe). Which item of the call runs
        is unknown until it answers: so that a call of *k* items none of which took the
        ``timeout`` is never taken for stuck, its item in progress counts as begun *k* - 1
        timeouts after the call did. A call of several items may so run up to *k* times the
        timeout before it is reported (``max_in_flight=2 * workers`` sends calls of one
        item)."""
        heads: dict[int, _Call] = {}
        for call in self.calls.values():
            heads.setdefault(call.worker, call)  # each actor's oldest call: the one it runs
        if not heads:
            return None
        per_item = self.timeout or 0.0
        return min(
            max(call.sent, self.answered[wid]) + (len(call.seqs) - 1) * per_item
            for wid, call in heads.items()
        )

    def _answer(self, ref: Any, call: _Call) -> list[Reply]:
        """A call's replies, of this pass (or its actor's death, dealt with)."""
        try:
            replies: list[Reply] = ray.get(ref)
        except ray.exceptions.RayTaskError as e:  # the call failed around the items: they fail
            return self._failed_call(call, e)
        except ray.exceptions.RayError as e:  # the actor, or the node holding its answer, died
            current = call.life == self.lives.lives[call.worker]
            return self._died(call.worker, e) if current and call.pass_id == self.pass_id else []
        out = []
        for reply in replies:
            if reply.kind == "init":
                where = f"worker_init in ray actor {call.worker} ({self._place(call.worker)})"
                raise_remote(reply.payload, where)
            if reply.pass_id != self.pass_id:
                continue  # a late answer of an abandoned pass
            self.outstanding[call.worker].pop(reply.seq, None)
            if reply.kind == "end":
                self.active[call.worker] = False
            out.append(reply)
        return out

    def _failed_call(self, call: _Call, error: Any) -> list[Reply]:
        """Ray failed a call with the actor alive (an item it could not unpickle): each of
        its items fails with the cause, and the pass goes on."""
        if call.pass_id != self.pass_id:
            return []
        from pipeflow.parallel.transport._wire import remote_error

        cause = error.cause if getattr(error, "cause", None) is not None else error
        with contextlib.suppress(Exception):
            cause.add_note(
                f"pipeflow: Ray could not run the call of ray actor {call.worker} "
                f"({self._place(call.worker)}) that held items {call.seqs}"
            )
        failed = remote_error(cause)
        for seq in call.seqs:
            self.outstanding[call.worker].pop(seq, None)
        return [Reply(call.pass_id, "err", seq, call.worker, 0, failed) for seq in call.seqs]

    def value(self, reply: Reply) -> Any:
        if reply.kind == "err":
            raise_remote(reply.payload, None)
        return unpack(reply.payload)

    def drop(self, reply: Reply) -> None:
        pass  # Ray frees a reply's object when nothing refers to it

    def in_flight(self) -> str:
        parts = [
            f"{held(items)} in ray actor {wid} ({self._place(wid)})"
            for wid, items in enumerate(self.outstanding)
            if items
        ]
        return "; ".join(parts) or "nothing"

    # -- an actor's death ------------------------------------------------------------------
    def _died(self, wid: int, error: Any) -> list[Reply]:
        """Actor *wid* is gone. Within the pass's restarts, a new actor takes its place and
        its items; else, or when one sample was being worked on at two deaths, raise
        :class:`WorkerDiedError` naming the actor, its node and the items."""
        pid, node = self._pid_node(wid, error)
        place, cause = self._place(wid, error), _cause(error)
        items = self.outstanding[wid]
        death = f"ray actor {wid} of {self.workers} ({place}) {cause} while holding {held(items)}"
        poison = self.lives.poison(items, f"{place}: {cause}")
        if poison is None and self.lives.may_restart():
            log.warning(
                "pipeflow: parallel stage %r: %s; a new actor takes its place and its items "
                "(restart %d of %d this epoch)",
                self.name,
                death,
                self.lives.used,
                self.lives.restarts,
            )
            self._replace(wid)
            return []
        self.broken = True
        msg = f"parallel stage {self.name!r}: {poison or death}"
        if poison is not None:
            msg += f"; {death}"
        elif self.lives.restarts:
            msg += f"; restarts={self.lives.restarts} were spent this epoch"
        else:
            msg += "; pass restarts=n to give a dead actor's items to a new one"
        died = WorkerDiedError(msg, pid=pid)
        died.node = node
        raise died

    def _replace(self, wid: int) -> None:
        """A new actor in *wid*'s place, sent the dead one's items again, in the order they
        were sent (the one it was working on first); the dead one's calls are forgotten."""
        with contextlib.suppress(Exception):
            ray.kill(self.actors[wid], no_restart=True)  # gone already, or cut off for good
        for ref in [r for r, c in self.calls.items() if c.worker == wid]:
            del self.calls[ref]
        self.answered[wid] = 0.0
        self.lives.next_life(wid)
        self._start(wid)
        self.unsent[wid] = list(self.outstanding[wid].items())

    def _replace_the_dead(self) -> None:
        """Between passes: an actor that died since (killed while idle) is replaced. Nothing
        was lost: no restart is used."""
        self._note_places(ray.wait(list(self._waiting_places()), timeout=0)[0])
        # An actor still waiting for room is not probed (its answer would never come).
        probes = {
            wid: actor.place.remote() for wid, actor in enumerate(self.actors) if self._started(wid)
        }
        ray.wait(list(probes.values()), num_returns=len(probes), timeout=None)
        for wid, probe in probes.items():
            try:
                self.places[wid] = ray.get(probe)
            except ray.exceptions.RayError as e:
                log.warning(
                    "pipeflow: parallel stage %r: ray actor %d of %d (%s) %s between passes; "
                    "a new actor takes its place",
                    self.name,
                    wid,
                    self.workers,
                    self._place(wid, e),
                    _cause(e),
                )
                with contextlib.suppress(Exception):
                    ray.kill(self.actors[wid], no_restart=True)
                self.lives.next_life(wid)
                self._start(wid)

    def _where(self, wid: int) -> tuple[int, str, str] | None:
        """``(pid, address, node id)`` of actor *wid*, once it has said (else ``None``)."""
        place = self.places[wid]
        if isinstance(place, tuple):
            return place
        with contextlib.suppress(Exception):
            if ray.wait([place], timeout=0)[0]:
                self.places[wid] = place = ray.get(place)
                return place  # type: ignore[no-any-return]
        return None

    def _pid_node(self, wid: int, error: Any = None) -> tuple[int | None, str | None]:
        where = self._where(wid)
        if where is not None:
            return where[0], where[2]
        text = str(error or "")
        pid, node = re.search(r"pid: (\d+)", text), re.search(r"Node Id: ([0-9a-f]+)", text)
        return (int(pid[1]) if pid else None), (node[1] if node else None)

    def _place(self, wid: int, error: Any = None) -> str:
        """``pid 1234, node 10.0.0.7 5f3a9c1e``: where actor *wid* runs, as far as known."""
        where = self._where(wid)
        if where is not None:
            return f"pid {where[0]}, node {node_words(where[1], where[2])}"
        text = str(error or "")
        pid, ip = re.search(r"pid: (\d+)", text), re.search(r"ip: (\S+)", text)
        node = re.search(r"Node Id: ([0-9a-f]+)", text)
        words = [f"pid {pid[1]}"] if pid else []
        if ip or node:
            words.append(f"node {ip[1] if ip else '?'}" + (f" {node[1][:8]}" if node else ""))
        return ", ".join(words) or "not started yet"

    # -- shutdown ---------------------------------------------------------------------------
    def close(self) -> None:
        """Kill every actor, and wait (up to a second) until Ray has them dead."""
        if self.closed:
            return
        self.closed = True
        LIVE.discard(self)
        self.calls.clear()
        actors, self.actors = [a for a in self.actors if a is not None], [None] * self.workers
        if not actors or not ray.is_initialized():  # interpreter exit: Ray ended them
            return
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        with contextlib.suppress(Exception):  # a call to a dead actor fails at once
            probes = [actor.place.remote() for actor in actors]
            ray.wait(probes, num_returns=len(probes), timeout=STOP_GRACE)


def ray_pool(spec: WorkerSpec, config: Any, name: str) -> RayPool:
    """The pool a ``backend="ray"`` stage's *config* (its ``Settings``) asks for."""
    pool = RayPool(
        spec,
        name=name,
        round_robin=config.round_robin,
        options=config.ray_options,
        restarts=config.restarts,
    )
    pool.skip_full = config.round_robin and not config.ordered
    pool.timeout = config.timeout
    return pool


def free_actors(ray_options: dict[str, Any] | None) -> int:
    """How many actors of *ray_options* (their ``num_cpus``) the free CPUs of the cluster
    hold now (at least one): what ``workers="auto"`` starts."""
    connect()
    free = float(ray.available_resources().get("CPU", 0))  # type: ignore[no-untyped-call]
    each = float(actor_options(ray_options).get("num_cpus") or 1)
    return max(1, int(free // each))


def _pickled(spec: WorkerSpec, name: str) -> bytes:
    """``(job, worker_init)`` pickled once for every actor; what can't be is refused now,
    before any actor starts."""
    from ray import cloudpickle

    try:
        return bytes(cloudpickle.dumps((spec.job, spec.worker_init)))  # type: ignore[no-untyped-call]
    except Exception as e:
        msg = (
            f"{name}: its work (the function or stages, with their datasets, and worker_init) "
            f"must be picklable by Ray's cloudpickle to run in Ray actors (got "
            f"{type(e).__name__}: {e})"
        )
        raise TypeError(msg) from e


def _check_fits(name: str, workers: int, options: dict[str, Any], round_robin: bool) -> None:
    """Warn when the cluster has too few free CPUs for the actors: those that do not fit
    wait for room (another pass's actors to end, an autoscaler to add nodes); the items go to
    those that run, except with *round_robin* (item k is actor k % workers')."""
    need = float(options.get("num_cpus") or 0) * workers
    free = float(ray.available_resources().get("CPU", 0))  # type: ignore[no-untyped-call]
    if need > free:
        have = float(ray.cluster_resources().get("CPU", 0))  # type: ignore[no-untyped-call]
        log.warning(
            "pipeflow: parallel stage %r: %d ray actors of num_cpus=%s need %g CPUs, and the "
            "Ray cluster has %g free (of %g); %s. Use fewer workers, a smaller "
            "ray_options['num_cpus'], or a larger cluster (or close the loaders whose "
            "persistent actors hold CPUs)",
            name,
            workers,
            options.get("num_cpus"),
            need,
            free,
            have,
            "with round_robin, the actors that do not fit wait until it has room, and their "
            "items with them"
            if round_robin
            else "the actors that run take the items, and the others join them as the "
            "cluster makes room",
        )


def _cause(error: Any) -> str:
    """Ray's reason for a failed call, in a few words.

    Examples:
        >>> _cause(Exception("The actor died...\\nThe actor is dead because it was killed by "
        ...                  "`ray.kill`."))
        'died (it was killed by `ray.kill`)'
        >>> _cause(KeyError("x"))
        "failed (KeyError: 'x')"
    """
    text = str(error)
    found = re.search(r"The actor (?:is dead|died) because ([^\n]*)", text)
    if found:
        return f"died ({found[1].rstrip('.')})"
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"failed ({type(error).__name__}: {first})"
