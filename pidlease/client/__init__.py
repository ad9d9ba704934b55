"""The producer and reader SDK: what an application imports (through ``pidlease``).

- ``producer``       ``AsyncProducer`` (the engine, on asyncio) and ``Producer`` (the same
                     engine on a background thread, for blocking code); ``ProducerState``
- ``config``         ``ProducerConfig`` (the tuning, checked) and ``ProducerSettings``
- ``sender``         one task per partition: drains the accumulator, the in-flight window,
                     resends; given its collaborators (``SenderContext``), it never sees
                     the producer
- ``accumulator``    per partition the open batch and the closed ones its sender has not
                     taken, the linger deadline; the one buffer counter
- ``record_columns`` ``send_batch``: a call's records as columns (lists or Arrow), routed
                     and encoded per batch in one step
- ``batch_future``   the outcome of a ``send_batch`` call: its one future, lazy metadata
- ``producer_batch`` ``ProducerBatch``: one batch being filled, and its records' outcome
- ``record_future``  the cheap per-record future ``Producer.send`` returns
- ``structs``        small value types: ``RecordMetadata``, ``BatchAck``
- ``retry``          the retry policy: ``Backoff``, which errors are retriable
- ``lease_keeper``   the PID lease: leased at start, renewed in the background
- ``lease_client``   HTTP clients for the coordinator's JSON API
- ``leader_pool``    where each partition's leader is; one connection per leader
- ``connection``     one pipelined connection to a partition server
- ``partitioner``    which partition a record goes to when the caller does not say
- ``reader``         ``Reader``: an iterator over one partition's records
- ``consumer``       ``Consumer``: a member of a consumer group (the Kafka listener's groups)
- ``processor``      ``Processor`` / ``AsyncProcessor``: read a topic, write a function of
                     it to another, effectively once (docs/processing.md)
- ``mirror``         copying topics between clusters on processors (``pidlease mirror``)

Imports go one way, down this list's dependency order (``producer`` -> ``sender`` ->
``accumulator`` / ``record_columns`` -> ``batch_future`` / ``producer_batch`` ->
``record_future`` -> ``structs``);
tests/unit/repo/test_import_graph.py fails on any cycle.
"""
