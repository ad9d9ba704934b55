"""The producer and reader SDK: what an application imports (through ``pidlease``).

- ``producer``       ``AsyncProducer`` (the engine, on asyncio) and ``Producer`` (the same
                     engine on a background thread, for blocking code)
- ``sender``         one task per partition: batching, the in-flight window, resends
- ``record_run``     records of one partition that fit in one batch, and their outcome
- ``record_future``  the cheap per-record future ``Producer.send`` returns
- ``lease_keeper``   the PID lease: leased at start, renewed in the background
- ``lease_client``   HTTP clients for the coordinator's JSON API
- ``leader_pool``    where each partition's leader is; one connection per leader
- ``connection``     one pipelined connection to a partition server
- ``partitioner``    which partition a record goes to when the caller does not say
- ``reader``         ``Reader``: an iterator over one partition's records
"""
