"""The pidlease coordinator: the HTTP/JSON lease service that hands out producer ids.

    settings.py     typed settings (PIDLEASE_* env)
    leases.py       the pure lease rules: new / renew / takeover / fenced / unknown, expiry states
    allocator.py    PID blocks reserved on the ZooKeeper counter by compare-and-set
    store.py        every ZooKeeper read and write (kazoo), with timeouts and error translation
    leaders.py      blocking socket client to partition leaders (PRODUCER_STATE, FENCE, METADATA)
    service.py      the lease flows: the I/O shell around leases.py
    topics.py       topic creation, listing, description
    housekeeper.py  background: ZooKeeper layout, ephemeral registration, PID sweeper
    schemas.py      strict request models
    guard.py        ASGI guard: body size cap, API token, no-500 catch-all
    app.py          FastAPI routes and error translation
    metrics.py      Prometheus text
    dashboard.py    the PID expiry page
    live_rows.py    the leaders' producer rows (PRODUCER_LIST), cached with their age
    pid_index.py    every PID record as compact columns: the PID list's pages and filters
    groups_view.py  the dashboard's consumer groups and their lag (Kafka listeners)

Run with ``python -m coordinator``; see docs/coordinator.md.
"""
