import sys, time, tempfile
from pidlease.devcluster import LocalCluster
from pidlease import Producer
with LocalCluster(tempfile.mkdtemp(prefix="exp-"), servers=1, coordinators=1) as c:
    for i, kw in enumerate([dict(), dict(max_in_flight=20), dict(), dict(max_in_flight=20, buffer_records_max=200000)]):
        c.create_topic(f"t{i}", 1)
        with Producer(c.coordinator_url, topic=f"t{i}", **kw) as p:
            v = b"v"*100; n = 300000
            t0 = time.perf_counter(); c0 = time.process_time()
            futs = [p.send(v) for _ in range(n)]
            p.flush()
            dt = time.perf_counter() - t0; cpu = time.process_time() - c0
        print(kw, f"{n/dt:,.0f} rec/s, client cpu {cpu/n*1e6:.2f} us/rec, busy {cpu/dt:.0%}", flush=True)
