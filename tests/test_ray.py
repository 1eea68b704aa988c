"""``backend="ray"`` on a real Ray: a cluster of three nodes simulated on this machine with
Ray's own ``ray.cluster_utils.Cluster`` (a head that runs no actors, two nodes of two CPUs,
each its own raylet on the loopback address).

The same items as the reference run for any actor count, in order or not; a task that
raises; an actor killed with ``ray.kill`` and a node removed mid-epoch (every item once, or
past the restarts a clear error naming the node and the items); a state resumed in a new
process that connects through ``RAY_ADDRESS``, with another actor count; and after every
test, no actor of a pass left alive (``ray.util.state``). The cluster starts once for the
module (about 25 s on 2 cores); the node is removed by the last test.
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import subprocess
import sys
import textwrap
import time
from collections import deque
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeflow as pf
from tests import _ray_cases as cases
from tests.faults import HangAt, RaiseAt, Samples, Share, Sleepy
from tests.strategies import lengths

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
STORE = 80 * 1024**2  # each node's object store: small, this machine is shared
FAST_HEALTH = {"health_check_period_ms": 500, "health_check_failure_threshold": 2}
#: The test cluster's dashboard port, picked free when the cluster starts.
DASHBOARD: dict[str, int] = {}


def _free_port() -> int:
    """A port no one listens on now (the OS picks it): the dashboard's default, 8265, is
    the machine's, and another cluster on it (another test run) would take it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def cluster() -> Any:
    """Three raylets: a head with the dashboard (``ray.util.state`` asks it) and no CPUs, so
    that actors land on the two worker nodes, which the node test can remove. The dashboard
    and its agent listen on ports picked free, not Ray's fixed defaults."""
    made = cluster_utils.Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "object_store_memory": STORE,
            "include_dashboard": True,
            "dashboard_port": DASHBOARD.setdefault("port", _free_port()),
            "dashboard_agent_listen_port": _free_port(),
            "_system_config": FAST_HEALTH,
        },
    )
    try:
        for _ in range(2):
            made.add_node(
                num_cpus=2, object_store_memory=STORE, dashboard_agent_listen_port=_free_port()
            )
        made.wait_for_nodes()
        ray.init(address=made.address, log_to_driver=False)
        yield made
    finally:
        ray.shutdown()
        made.shutdown()


def _alive_pipeflow_actors() -> list[Any]:
    from ray.util.state import list_actors

    # The dashboard by its address: another run's cluster on this machine would make Ray's
    # own lookup ambiguous ("Found multiple active Ray instances").
    address = f"http://127.0.0.1:{DASHBOARD['port']}"
    alive = list_actors(
        address=address, filters=[("state", "=", "ALIVE")], raise_on_missing_output=False
    )
    return [a for a in alive if (a.name or "").startswith("pipeflow/")]


@pytest.fixture(autouse=True)
def nothing_left(cluster: Any) -> Any:
    """After each test: no actor of its passes alive. Ray reports a kill within moments on a
    quiet machine; the bound only tells a leak from a slow report on a busy one."""
    yield
    deadline = time.monotonic() + 60.0
    while (left := _alive_pipeflow_actors()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], f"actors left running: {[a.name for a in left]}"


def _items_lists() -> Any:
    """Lists of items drawn from the shared lengths (capped: every example runs on Ray)."""
    return lengths.map(lambda n: min(n, 60)).flatmap(
        lambda n: st.lists(st.integers(-1000, 1000), min_size=n, max_size=n)
    )


class _Held:
    """A re-iterable source whose items a test sets before each pass (so that one loader,
    and its persistent actors, serve every example)."""

    items: ClassVar[list[int]] = []

    def __iter__(self) -> Any:
        return iter(self.items)


@pytest.mark.parametrize(
    ("workers", "ordered", "in_flight"), [(1, True, None), (3, True, 5), (3, False, 1)]
)
def test_the_same_items_as_one_process_for_any_actor_count(
    cluster: Any, workers: int, ordered: bool, in_flight: int | None
) -> None:
    stage = pf.parallel_map(
        cases.cube,
        workers=workers,
        backend="ray",
        ordered=ordered,
        max_in_flight=in_flight,
        persistent=True,
    )
    loader = pf.from_iterable(_Held()) | stage

    @settings(max_examples=10)
    @given(items=_items_lists())
    def check(items: list[int]) -> None:
        _Held.items = items
        got = list(loader)
        want = [cases.cube(i) for i in items]
        assert got == want if ordered else sorted(got) == sorted(want)

    with loader:
        check()


def test_draws_keyed_by_position_match_the_process_backend(cluster: Any) -> None:
    def run(**kw: Any) -> list[Any]:
        stage = pf.parallel_map(pf.random_map(cases.noise, seed=5), seed=9, **kw)
        with pf.indices(23) | pf.shuffle(seed=4) | stage as loader:
            return list(loader)

    assert run(workers=3, backend="ray") == run(workers=2, backend="process")


def test_parallel_source_runs_a_replica_in_each_actor(cluster: Any) -> None:
    """Each actor iterates its own copy of the loader, which splits itself by the worker
    info the actor sets (``backend="ray"``, its node named)."""
    source = pf.from_iterable(Share(11)) | pf.map(cases.with_worker)
    with pf.parallel_source(source, workers=2, backend="ray") as loader:
        got = list(loader)
    assert [i for i, _ in got] == list(range(11))
    assert {(i % 2, w) for i, w in got} == {(0, "0 of 2 ray"), (1, "1 of 2 ray")}


def test_a_task_that_raises_is_a_value_and_the_pass_goes_on(cluster: Any) -> None:
    stage = pf.parallel_map(pf.fetch(Samples(8, RaiseAt(5))), workers=2, backend="ray")
    with pf.indices(8) | stage as loader:
        it = iter(loader)
        assert [next(it) for _ in range(5)] == [0, 1, 2, 3, 4]
        with pytest.raises(KeyError, match="injected failure at 5") as caught:
            next(it)
        assert list(it) == [6, 7]
    note = " ".join(getattr(caught.value, "__notes__", []))
    assert "sample index 5" in note and "ray actor" in note and "node " in note, note
    dropped = pf.indices(8) | stage | pf.ignore_errors(max_count=1)
    with dropped:
        assert list(dropped) == [0, 1, 2, 3, 4, 6, 7]


def test_results_are_read_from_the_object_store_without_a_copy(cluster: Any) -> None:
    stage = pf.parallel_map(cases.big, workers=2, backend="ray")
    with pf.indices(4) | stage as loader:
        arrays = list(loader)
    assert [int(a[0, 0]) for a in arrays] == [0, 1, 2, 3]
    maps = Path("/proc/self/maps").read_text().splitlines()
    for a in arrays:
        address = a.__array_interface__["data"][0]
        inside = [line for line in maps if _holds(line, address)]
        assert inside and ("plasma" in inside[0] or "/dev/shm" in inside[0]), inside
        a[0, 0] = -1  # writable, as a process worker's result is


def _holds(line: str, address: int) -> bool:
    start, end = (int(x, 16) for x in line.split()[0].split("-"))
    return start <= address < end


def test_an_actor_killed_mid_epoch_loses_and_repeats_nothing(cluster: Any, caplog: Any) -> None:
    stage = pf.parallel_map(
        pf.fetch(cases.SlowSquares(60)), workers=2, backend="ray", restarts=1, max_in_flight=8
    )
    with pf.indices(60) | stage as loader, caplog.at_level(logging.WARNING, "pipeflow"):
        it = iter(loader)
        got = [next(it) for _ in range(10)]
        victim = sorted(n for n in ray.util.list_named_actors() if n.startswith("pipeflow/"))[0]
        ray.kill(ray.get_actor(victim))
        got += list(it)
    assert got == [i * i for i in range(60)]
    assert "killed by `ray.kill`" in caplog.text and "a new actor takes its place" in caplog.text
    stats = loader.stats().stages[-1]  # the actors' time on items, as for worker processes
    assert stats.workers == 2 and stats.worker_busy and stats.item_seconds_p50 >= 0.009
    assert stats.queue_occupancy is not None and 0 < stats.queue_occupancy <= 1


def test_past_the_restarts_a_killed_actor_ends_the_pass_naming_node_and_items(
    cluster: Any,
) -> None:
    stage = pf.parallel_map(pf.fetch(cases.SlowSquares(60)), workers=2, backend="ray")
    with pf.indices(60) | stage as loader:
        it = iter(loader)
        got = [next(it) for _ in range(10)]
        victim = sorted(n for n in ray.util.list_named_actors() if n.startswith("pipeflow/"))[0]
        ray.kill(ray.get_actor(victim))
        with pytest.raises(pf.WorkerDiedError) as caught:
            got += list(it)
    text = str(caught.value)
    assert "ray actor 0 of 2" in text and "node " in text and "sample indices" in text, text
    assert caught.value.node is not None and caught.value.undelivered
    delivered = set(got)
    assert not delivered & {i * i for i in caught.value.undelivered}


def _warmed(stage: Any, workers: int) -> Any:
    """*stage* (persistent) over :class:`_Held`, after an empty pass made its actors and each
    of them answered: a pass's ``timeout`` counts an actor's start, which takes seconds here."""
    loader = pf.from_iterable(_Held()) | stage
    _Held.items = []
    list(loader)
    deadline = time.monotonic() + 60
    while len(names := _pipeflow_actor_names()) < workers and time.monotonic() < deadline:
        time.sleep(0.1)
    ray.get([ray.get_actor(name).place.remote() for name in names], timeout=60)
    return loader


def _pipeflow_actor_names() -> list[str]:
    return [n for n in ray.util.list_named_actors() if n.startswith("pipeflow/")]


def test_a_stuck_actor_is_reported_before_the_others_drain_the_input(cluster: Any) -> None:
    """Issue 37 on Ray: in calls of one item (``max_in_flight=2 * workers``), a stuck item
    is reported ``timeout`` seconds after its call began, whatever the other actors deliver
    meanwhile (600 items of 50 ms: 15 s of work for the two others)."""
    stage = pf.parallel_map(
        Sleepy(HangAt(5), 0.05),
        workers=3,
        backend="ray",
        ordered=False,
        max_in_flight=6,
        timeout=2,
        persistent=True,
    )
    loader = _warmed(stage, 3)
    _Held.items = list(range(600))
    got: list[int] = []
    with loader, pytest.raises(pf.WorkerTimeoutError) as caught:
        deque(map(got.append, loader), 0)
    assert len(got) < 300, len(got)
    assert 5 in caught.value.undelivered and "ray actor" in str(caught.value)


def test_a_call_of_several_items_none_slow_is_not_taken_for_stuck(cluster: Any) -> None:
    """One actor, calls of 4 items (``max_in_flight=8``) of 0.3 s, ``timeout=0.5``: a call
    runs 1.2 s, and is answered only then, but none of its items took the timeout."""
    stage = pf.parallel_map(
        Sleepy(abs, 0.3), workers=1, backend="ray", max_in_flight=8, timeout=0.5, persistent=True
    )
    loader = _warmed(stage, 1)
    _Held.items = list(range(8))
    with loader:
        assert list(loader) == list(range(8))


RESUME = textwrap.dedent(
    """
    import pickle, sys
    from tests._ray_cases import resumable
    kind, workers, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    loader = resumable(kind, workers)
    with open(path, "rb") as f:
        loader.load_state_dict(pickle.load(f))
    with loader:
        rest = list(loader)
    with open(path, "wb") as f:
        pickle.dump(rest, f)
    """
)


def test_a_state_resumes_exactly_with_another_actor_count(cluster: Any) -> None:
    """Map-style, draws keyed by position: a state taken with 3 actors resumes on 2."""
    with cases.resumable("draws", 3) as loader:
        it = iter(loader)
        head = [next(it) for _ in range(6)]
        state = loader.state_dict()
        whole = head + list(it)  # the same pass, uninterrupted
    with cases.resumable("draws", 2) as loader:
        loader.load_state_dict(state)
        assert head + list(loader) == whole


def test_a_state_resumes_exactly_in_a_new_process(cluster: Any, tmp_path: Path) -> None:
    """Each actor's copy of a stateful dataset counts its reads (which each sample shows):
    the replies' states make the state; a new interpreter, which finds the cluster through
    ``RAY_ADDRESS`` (Ray's convention), loads it into a freshly built loader."""
    with cases.resumable("stateful", 2) as loader:
        it = iter(loader)
        head = [next(it) for _ in range(7)]
        state = loader.state_dict()
        whole = head + list(it)  # the same pass, uninterrupted
    path = tmp_path / "state.pkl"
    path.write_bytes(pickle.dumps(state))
    env = {**os.environ, "RAY_ADDRESS": cluster.address, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", RESUME, "stateful", "2", str(path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rest = pickle.loads(path.read_bytes())
    assert head + rest == whole


def _wait_until_dead(node_id: str, within: float = 60.0) -> None:
    """Until Ray's control store says the node is dead (how long a killed raylet takes to be
    seen is the machine's: a pass of 150 quick items may end first on a fast one, and a
    replacement may be placed on the dying node on a slow one)."""
    import ray

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes()):
            return
        time.sleep(0.05)
    raise AssertionError(f"node {node_id[:8]} still alive {within} s after it was removed")


def test_a_node_removed_mid_epoch_loses_and_repeats_nothing(cluster: Any, caplog: Any) -> None:
    """Last: the cluster has one worker node after it."""
    stage = pf.parallel_map(cases.where, workers=2, backend="ray", restarts=2)
    with pf.indices(150) | stage as loader, caplog.at_level(logging.WARNING, "pipeflow"):
        it = iter(loader)
        got = [next(it) for _ in range(10)]
        node = next(n for n in cluster.worker_nodes if n.node_id == got[-1][1])
        cluster.remove_node(node, allow_graceful=False)
        _wait_until_dead(node.node_id)  # else the pass may end before Ray sees it die
        got += list(it)
    assert [i for i, _ in got] == list(range(150))
    assert "a new actor takes its place" in caplog.text, caplog.text
    assert node.node_id[:8] in caplog.text
    (left,) = cluster.worker_nodes
    # The removed node's actor works on until its raylet is gone (how long that takes is the
    # machine's: a busy one computed items 130+ there): from its last item on, every item,
    # those it held and re-sent included, came from the node that is left.
    last = max(i for i, n in got if n == node.node_id)
    assert {n for i, n in got if i > last} == {left.node_id}, last


def test_items_go_to_the_actors_that_run_when_the_cluster_has_no_room_for_all(
    cluster: Any, caplog: Any
) -> None:
    """Three actors of 2 CPUs on two nodes of 2: the third has no room while the others run
    (the pass used to wait for it forever); the items go to the two that run, in order."""
    stage = pf.parallel_map(abs, workers=3, backend="ray", ray_options={"num_cpus": 2}, timeout=120)
    loader = pf.from_iterable(range(-40, 0)) | stage
    with caplog.at_level(logging.WARNING, logger="pipeflow"):
        for _ in range(2):  # and again: a pass does not wait for the actor still waiting
            assert list(loader) == list(range(40, 0, -1))
    assert "the actors that run take the items" in caplog.text
    loader.close()


def test_auto_starts_an_actor_per_free_cpu_and_says_so(cluster: Any) -> None:
    """``workers="auto"`` starts as many actors as the cluster's free CPUs hold (the other
    tests' persistent actors may hold some), never one it has no room for."""
    for each in (1, 2):
        free = _settled_free_cpus()
        stage = pf.parallel_map(abs, workers="auto", backend="ray", ray_options={"num_cpus": each})
        loader = pf.from_iterable(range(-30, 0)) | stage
        assert list(loader) == list(range(30, 0, -1))
        row = loader.stats().stages[-1]
        want = max(1, int(free // each))
        assert row.workers == want, free
        words = "the Ray cluster's free CPUs when its actors started"
        assert row.auto == f"auto: {want} actor{'s' if want > 1 else ''} ({words})"
        loader.close()


def _settled_free_cpus() -> float:
    """The cluster's free CPUs once the last loader's actors gave theirs back (two reads
    half a second apart agree)."""
    deadline = time.monotonic() + 60
    last = -1.0
    while time.monotonic() < deadline:
        free = float(ray.available_resources().get("CPU", 0))
        if free == last:
            return free
        last = free
        time.sleep(0.5)
    return last


def test_an_auto_parallel_source_starts_an_actor_per_free_cpu(cluster: Any) -> None:
    """``parallel_source(workers="auto", backend="ray")``: a replica in an actor per free
    CPU of the cluster, chosen once; every item once."""
    free = _settled_free_cpus()
    source = pf.from_iterable(Share(23)) | pf.map(cases.with_worker)
    with pf.parallel_source(source, workers="auto", backend="ray") as loader:
        got = list(loader)
        want = max(1, int(free))
        assert sorted(i for i, _ in got) == list(range(23))
        assert {w for _, w in got} == {f"{k} of {want} ray" for k in range(min(want, 23))}
        assert loader.stats().stages[0].auto.startswith(f"auto: {want} actor")
