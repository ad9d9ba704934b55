"""Test tools, public like ``trio.testing``: use them to test code that publishes with
pidlease, against real processes or fakes.

- ``zkserver``     a real ZooKeeper (Debian's 3.8 package) on 127.0.0.1 with its own data dir
- ``devcluster``   ``LocalCluster``: ZooKeeper, coordinators and partition servers as
                   real processes with real files (``pidlease dev up``, demo, tests)
- ``faultproxy``   a loopback TCP proxy that cuts, delays and stalls connections on demand
"""
