"""A server loads every group log partition it leads when it comes to lead it, not at the
first request for one of its groups (as a Kafka broker does at its election): ListGroups,
which covers every partition a server leads, is answered at once once the servers have
settled. It used to answer COORDINATOR_LOAD_IN_PROGRESS to the first ListGroups of each
server (loading only the partitions of groups asked for before), and kafkajs's
``admin.listGroups`` gives up on that (test_kafka_kafkajs_features.py)."""

from __future__ import annotations

import time
from typing import Any

from partition_server.kafka import codec as C
from tests.integration.test_kafka_group_compaction import commit
from tests.integration.test_kafka_group_retention import coordinator
from tests.integration.test_kafka_groups import ENV
from tests.kafka_wire import KafkaWire


def test_list_groups_answered_without_a_load_in_progress(make_cluster: Any) -> None:
    c = make_cluster(servers=2, env=ENV)
    c.create_topic("gtopic", partitions=1, replication_factor=2)
    addr = coordinator(c, "lister")
    with KafkaWire(addr) as w:
        assert commit(w, "lister", {("gtopic", 0): 3}) == {0: 0}
    time.sleep(3)  # the servers load what they lead meanwhile
    for s in c.servers:
        with KafkaWire(s.kafka_address) as w:
            r = w.request(C.LIST_GROUPS, 4, {"states_filter": []})
            assert int(r.error_code) == 0, f"server {s.ident}: ListGroups {r.error_code}"
            if s.kafka_address == addr:
                assert [g.group_id for g in r.groups] == ["lister"]
