"""Test tools, public like ``trio.testing``: use them to test code that publishes with
pidlease, against real processes or fakes (guide: ``docs/testing.md``). Nothing here imports
``coordinator`` or ``partition_server``; their own internal test helpers live beside them
(``coordinator/testing.py``, ``partition_server/testing.py``).

- ``zkserver``     a real ZooKeeper (Debian's 3.8 package) on 127.0.0.1 with its own data dir
- ``devcluster``   ``LocalCluster``: ZooKeeper, coordinators and partition servers as
                   real processes with real files (``pidlease dev up``, demo, tests)
- ``faultproxy``   a loopback TCP proxy that cuts, delays and stalls connections on demand
- ``fakes``        ``FakePartitionServer`` and ``FakeCoordinator``: an in-process cluster
                   with fault switches, for fast tests of producer and reader code
- ``wire``         ``WireClient``, a blocking partition-server client for protocol tests,
                   with batch, token and topic builders
- ``http``         ``HttpConnection`` and ``run_many``: a lean HTTP/1.1 client and load
                   driver for the coordinator's JSON API
"""
