"""pipeflow's benchmarks: pipeflow and ``torch.utils.data.DataLoader`` side by side in one run.

Run them all with ``python -m pipeflow bench`` (``--quick`` for a short run) from the
repository root, or one module directly, e.g. ``python -m benchmarks.throughput``.
"""
