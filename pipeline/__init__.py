"""The PySpark side of pidlease: a ``pidlease`` data source for batch and streaming writes
and reads, and the ``pidlease-spark`` publish/audit commands.

Not built yet (GitHub issue 8). ``pidlease-spark`` says so and exits 2 rather than pretend.
"""
