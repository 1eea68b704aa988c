"""How a result travels from a worker process to the main process.

- ``_wire``: what travels between them, as typed records (a ``Task`` out, a ``Reply`` back),
  never bare tuples;
- ``_shm``: the shared-memory transport: a worker's ``Writer`` pickles a result with its
  large buffers out of band into a segment, the main process's ``Reader`` maps it and
  rebuilds the arrays as views, with no copy through the pipe;
- ``_segments``: the segments themselves, files in ``/dev/shm``: named, created, sized,
  recycled and removed.

It imports nothing of :mod:`pipeflow.parallel` outside this package, and only the ground floor
(``errors``) of pipeflow.
"""
