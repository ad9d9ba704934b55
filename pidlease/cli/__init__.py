"""The ``pidlease`` command line (``python -m pidlease`` or ``python -m pidlease.cli``).

- ``commands``  the argument parser and one ``cmd_*`` function per subcommand
- ``devctl``    ``dev up`` / ``dev down``: a local cluster's lifecycle
- ``demo``      exactly-once publishing shown end to end under injected faults
- ``verify``    the exactly-once audit of a topic (no duplicate, no missing sequence)
- ``mirror``    ``pidlease mirror``: topics copied to another cluster, exactly once
"""
