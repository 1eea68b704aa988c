"""Ray actors as a pool's workers (``backend="ray"``): a pipeline's heavy stage on a cluster.

- ``_ray``: the pool: actors made when first needed, calls of several items each;
- ``_ray_worker``: what one actor does;
- ``_ray_wire``: a result's way back, pickled with its large buffers out of band, through
  Ray's object store;
- ``_ray_options``: what each actor asks the cluster for, checked when the stage is built
  (nothing of Ray is imported there).

It imports :mod:`pipeflow.parallel.pools` (the protocol, the workers' lives and jobs) and
:mod:`pipeflow.parallel.transport`. Ray itself is imported only when a pool starts.
"""
