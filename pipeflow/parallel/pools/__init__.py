"""Who runs a parallel stage's work: pools of workers, and their lives.

- ``_protocol``: the small protocol every pool keeps (give tasks, collect replies, drop,
  close), and what they share;
- ``_threads``: worker threads; ``_processes``: worker processes, each with its own duplex
  pipe, results back through shared memory; ``_aio`` and ``_aio_worker``: coroutine
  functions on event loops, in threads or in a worker process;
- ``_worker``: the worker side: what a worker does with one task (the jobs), and a process
  worker's loop;
- ``_lives``: a worker that dies is replaced within a budget of restarts, and a sample at
  the heart of repeated deaths is named; ``_reap``: shutdown off the consumer's path;
- ``_fork``, ``_warm`` and ``_zygote``: starting worker processes well (fork's frozen heap,
  the job pickled once, a warm private fork server for spawn and forkserver).

It imports :mod:`pipeflow.parallel.transport` and the floors below the parallel package
(the stage protocol, the resume package's workers' states), never :mod:`pipeflow.parallel.ray`
or the modules of :mod:`pipeflow.parallel` itself.
"""
