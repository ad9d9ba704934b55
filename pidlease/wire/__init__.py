"""What the SDK and the servers share on the wire and in ZooKeeper (the servers import
only this and ``pidlease.errors`` from ``pidlease``).

- ``framing``   the u32 length prefix: the one place that packs or reads it (sans-I/O)
- ``protocol``  request/response messages and the batch format (on disk = as sent); the
                header decode of both formats a log holds (ours, Kafka's RecordBatch v2)
- ``kafka_batch`` Kafka RecordBatch v2: validation with Kafka's codes, encoding, and our
                batches converted for Kafka consumers
- ``kafka_errors`` Kafka's error codes: the one table (SDK, servers, coordinator)
- ``kafka_conn`` a blocking client for a few Kafka requests (consumer groups)
- ``token``     lease tokens, HMAC-signed by the coordinator, checked by partition servers
- ``cluster``   the ZooKeeper layout: paths and the JSON records stored there
- ``tls``       SSL contexts for both ports, and the errors a failed handshake becomes
"""
