"""The partition server: hosts partition logs and enforces the idempotent append rules.

How it is built (one noun per module):

- ``settings``        typed settings from ``PIDLEASE_*`` environment variables
- ``append_rules``    the append rules, readable and pure (spec:
tests/unit/server/append_rules_model.py)
- ``producer_state``  per-PID state of one partition as columns, with the rules' fast twin
- ``log``             segment files of one partition, the batch index, torn-tail recovery
- ``snapshot``        one atomic file per server: offset vector + producer state
- ``flusher``         group commit: fsync in an executor, then acks in order
- ``partition``       one partition: log + producer state + durability waiters, its role
- ``produce``         the one produce path of both protocols: route, check, append, count
- ``kafka_partition`` the Kafka face of a partition: Produce and Fetch of RecordBatch v2
- ``registry``        ZooKeeper: our ephemeral znode, topics and partition states we host
- ``server``          the asyncio TCP front: framing, dispatch, pipelined responses
- ``ordered``         one connection's answers in request order (both listeners)
- ``__main__``        ``python -m partition_server``
"""
