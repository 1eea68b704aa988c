"""``ray_options``: what each Ray actor of a ``backend="ray"`` stage asks the cluster for,
checked when the stage is built (nothing of Ray is imported here).

The options are Ray's own actor options (``ActorClass.options(...)``): resources
(``num_cpus``, ``num_gpus``, ``memory``, ``resources``, ...), placement
(``scheduling_strategy``, ``placement_group``, ``label_selector``, ...) and ``runtime_env``.
The ones that would change how pipeflow runs its actors are refused, with the reason: pipeflow
names its actors, replaces a dead one itself (``restarts=``), and runs one item at a time on
each, in the order sent.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

__all__ = ["DEFAULT_OPTIONS", "actor_options", "check_installed", "check_ray_options"]

#: What an actor asks for unless ``ray_options`` says otherwise: one CPU (a worker runs one
#: item at a time), and actors spread over the cluster's nodes rather than packed on one.
DEFAULT_OPTIONS: dict[str, Any] = {"num_cpus": 1, "scheduling_strategy": "SPREAD"}

#: Ray's actor options that pipeflow passes on as they are.
ALLOWED = frozenset(
    {
        "accelerator_type",
        "enable_task_events",
        "fallback_strategy",
        "label_selector",
        "memory",
        "num_cpus",
        "num_gpus",
        "object_store_memory",
        "placement_group",
        "placement_group_bundle_index",
        "placement_group_capture_child_tasks",
        "resources",
        "runtime_env",
        "scheduling_strategy",
    }
)

#: Ray's actor options that pipeflow sets itself, and why.
REFUSED = {
    "name": "pipeflow names each actor (pipeflow/<stage>/<pool>/<worker>)",
    "namespace": "the actors live in the driver's namespace, which its job owns",
    "get_if_exists": "each pass's actors are its own",
    "lifetime": "a detached actor would outlive the loader that started it",
    "max_restarts": "pipeflow replaces a dead actor itself and sends it the dead one's items: "
    "pass restarts= instead",
    "max_task_retries": "pipeflow sends a dead actor's items to its replacement: pass restarts= "
    "instead",
    "max_concurrency": "an actor runs one item at a time, as a worker process does",
    "concurrency_groups": "an actor runs one item at a time, as a worker process does",
    "allow_out_of_order_execution": "an actor runs its items in the order sent",
    "max_pending_calls": "pipeflow bounds the items in flight itself: pass max_in_flight=",
    "enable_tensor_transport": "results travel through the object store",
    "_actor_generator_backpressure_num_objects": "pipeflow's actors are not generators",
}


def check_ray_options(stage: str, options: Any, backend: str) -> dict[str, Any] | None:
    """*options*, checked: ``None``, or a mapping of Ray's actor options (a copy).

    Examples:
        >>> check_ray_options("parallel_map", {"num_cpus": 2}, "ray")
        {'num_cpus': 2}
        >>> check_ray_options("parallel_map", {"max_restarts": 3}, "ray")
        Traceback (most recent call last):
        ...
        ValueError: parallel_map: ray_options can't set 'max_restarts' (got 3): pipeflow ...
    """
    if backend == "ray":
        check_installed(stage)
    if options is None:
        return None
    if backend != "ray":
        msg = (
            f"{stage}: ray_options applies to backend='ray' only (got ray_options={options!r} "
            f"with backend={backend!r})"
        )
        raise ValueError(msg)
    if not isinstance(options, Mapping):
        msg = f"{stage}: ray_options must be a mapping of Ray actor options (got {options!r})"
        raise TypeError(msg)
    for key, value in options.items():
        if not isinstance(key, str):
            msg = f"{stage}: ray_options keys must be option names (got {key!r})"
            raise TypeError(msg)
        if key in REFUSED:
            msg = f"{stage}: ray_options can't set {key!r} (got {value!r}): {REFUSED[key]}"
            raise ValueError(msg)
        if key not in ALLOWED:
            msg = (
                f"{stage}: ray_options must hold Ray actor options, one of "
                f"{', '.join(sorted(ALLOWED))} (got {key!r})"
            )
            raise ValueError(msg)
    return dict(options)


def check_installed(stage: str) -> None:
    """Refuse ``backend="ray"`` now, when Ray is not installed (found without importing it)."""
    if importlib.util.find_spec("ray") is None:
        msg = (
            f"{stage}: backend='ray' needs Ray, which is not installed (got backend='ray'); "
            "install it with: pip install 'pipeflow[ray]'"
        )
        raise ModuleNotFoundError(msg, name="ray")


def actor_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The options each actor is made with: the defaults, updated with *options*.

    Examples:
        >>> actor_options({"num_cpus": 0.5})
        {'num_cpus': 0.5, 'scheduling_strategy': 'SPREAD'}
    """
    return {**DEFAULT_OPTIONS, **(options or {})}
