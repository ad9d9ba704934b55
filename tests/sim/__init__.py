"""Deterministic simulation of the partition-server side (see README.md).

One seed drives everything: a virtual-time event loop, a simulated disk, network and
ZooKeeper, and pipelining producers, around the real partition-server code. A seed that
fails replays exactly with ``python -m tests.sim replay <seed> -v``."""
