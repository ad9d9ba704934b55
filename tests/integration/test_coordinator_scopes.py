"""API principals, scopes, PID ownership and the PID limit per principal, against real
coordinator processes on the session ZooKeeper.

- the matrix caller (no token, wrong token, producer, admin, legacy ``api_token``) x
  endpoint: status and error code, and nothing changed by a refused call;
- a producer principal cannot renew, take over or read another principal's PID (no
  generation bump), an admin can; the owner shows in the PID views;
- the dashboard: admin token as a bearer header or as the cookie set by
  ``/dashboard?token=...`` (a redirect that drops the token from the address);
- ``pids_max_per_principal`` exact under concurrent new leases on two coordinators, and
  consistent with ZooKeeper after a coordinator is SIGKILLed mid-run;
- a PID swept past retention frees its slot.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from coordinator.store import principal_path
from pidlease import errors
from pidlease.client.lease_client import LeaseClient
from pidlease.client.producer import Producer
from pidlease.testing.http import Reply, run_many
from pidlease.wire import cluster as layout
from pidlease.wire.cluster import connect_zk

ADMIN_TOKEN = "ops-admin-token-0001"
P1_TOKEN = "p1-producer-token-0001"
P2_TOKEN = "p2-producer-token-0001"
LEGACY_TOKEN = "legacy-admin-token-0001"

CALLERS: dict[str, str | None] = {
    "none": None,
    "wrong": "not-a-configured-token",
    "producer": P1_TOKEN,
    "admin": ADMIN_TOKEN,
    "legacy api_token": LEGACY_TOKEN,
}


def auth_env(tmp_path: Any, **extra: str) -> dict[str, str]:
    tokens_file = tmp_path / "principals.txt"
    tokens_file.write_text(f"# producers kept out of the environment\np2:producer:{P2_TOKEN}\n")
    return {
        "PIDLEASE_API_TOKEN": LEGACY_TOKEN,
        "PIDLEASE_API_TOKENS": f"ops:admin:{ADMIN_TOKEN},p1:producer:{P1_TOKEN}",
        "PIDLEASE_API_TOKENS_FILE": str(tokens_file),
        **extra,
    }


_clients: list[httpx.Client] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _clients:
        _clients.pop().close()


def client(url: str, token: str | None) -> httpx.Client:
    """An API client with ``token`` as its bearer token; closed after the test."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    c = httpx.Client(base_url=url, headers=headers, timeout=30)
    _clients.append(c)
    return c


def lease(c: httpx.Client, **body: Any) -> httpx.Response:
    return c.post("/v1/lease_pid", json={"topic": "orders", "partition": 0, "pid": -1, **body})


def state_of(admin: httpx.Client) -> tuple[Any, ...]:
    """What a refused call must not change: topics, and every PID's generation and expiry."""
    topics = sorted(t["name"] for t in admin.get("/v1/topics").json()["topics"])
    pids = sorted(
        (p["pid"], p["generation"], p["expires_at_ms"], p["owner"])
        for p in admin.get("/v1/pids").json()["pids"]
    )
    return tuple(topics), tuple(pids)


OPEN, PRODUCER, ADMIN = "open", "producer", "admin"


def expected(kind: str, caller: str) -> tuple[int, str | None]:
    if kind == OPEN:
        return 200, None
    if caller in ("none", "wrong"):
        return 401, "UNAUTHORIZED"
    if caller == "producer" and kind == ADMIN:
        return 403, "FORBIDDEN"
    return 200, "NONE"


@pytest.mark.slow
def test_scope_matrix(make_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cl = make_cluster(servers=1, env=auth_env(tmp_path))
    url = cl.coordinator_url
    admin = client(url, ADMIN_TOKEN)
    assert admin.post("/v1/topics", json={"name": "orders", "partitions": 2}).status_code == 200
    p1 = client(url, P1_TOKEN)
    own = lease(p1)
    assert own.status_code == 200, own.text
    own_pid = own.json()["pid"]
    routes: list[tuple[str, str, str, Any]] = [
        (
            PRODUCER,
            "POST",
            "/v1/lease_pid",
            lambda who: {"topic": "orders", "partition": 0, "pid": -1},
        ),
        (
            PRODUCER,
            "POST",
            "/v1/lease_pid/batch",
            lambda who: {"requests": [{"topic": "orders", "partition": 1, "pid": -1}]},
        ),
        (PRODUCER, "GET", "/v1/topics", None),
        (PRODUCER, "GET", "/v1/topics/orders", None),
        (PRODUCER, "GET", f"/v1/pids/{own_pid}", None),
        (
            ADMIN,
            "POST",
            "/v1/topics",
            lambda who: {"name": f"t-{who.replace(' ', '-')}", "partitions": 1},
        ),
        (ADMIN, "PATCH", "/v1/topics/orders", lambda who: {"retention_ms": 3_600_000}),
        (ADMIN, "GET", "/v1/pids", None),
        (PRODUCER, "GET", "/v1/servers", None),
        (ADMIN, "GET", "/v1/coordinators", None),
        (ADMIN, "POST", "/v1/cluster/rebalance", lambda who: {"dry_run": True}),
        (ADMIN, "GET", "/v1/cluster/moves", None),
        (ADMIN, "GET", "/dashboard", None),
        (ADMIN, "GET", "/dashboard/data", None),
        (OPEN, "GET", "/healthz", None),
        (OPEN, "GET", "/metrics", None),
        (OPEN, "GET", "/openapi.json", None),
        (OPEN, "GET", "/dashboard/static/dashboard.js", None),
    ]
    rows = []
    for kind, method, path, body in routes:
        cells = []
        for caller, token in CALLERS.items():
            want_status, want_error = expected(kind, caller)
            before = state_of(admin) if want_status != 200 else None
            with client(url, token) as c:
                r = c.request(method, path, json=body(caller) if body else None)
            got_error = (
                r.json().get("error")
                if r.headers.get("content-type", "").startswith("application/json")
                else None
            )
            cells.append(f"{r.status_code} {got_error or ''}".strip())
            assert r.status_code == want_status, (caller, method, path, r.status_code, r.text)
            if want_error and r.headers["content-type"].startswith("application/json"):
                assert got_error == want_error, (caller, method, path, r.text)
            if want_status == 403:
                assert "'admin'" in r.json()["detail"], r.text  # names the scope needed
            if before is not None:
                assert state_of(admin) == before, f"{caller} {method} {path} changed something"
        shown = path.replace(f"/pids/{own_pid}", "/pids/{own pid}")
        rows.append(f"| {method} {shown} | " + " | ".join(cells) + " |")
    print("SCOPE MATRIX\n| endpoint | " + " | ".join(CALLERS) + " |\n" + "\n".join(rows))
    names = {t["name"] for t in admin.get("/v1/topics").json()["topics"]}
    assert {"t-admin", "t-legacy-api_token"} <= names
    assert not names & {"t-none", "t-wrong", "t-producer"}
    # the file-configured principal works too, with the producer scope
    with client(url, P2_TOKEN) as p2:
        assert p2.get("/v1/topics").status_code == 200
        r = p2.get("/v1/pids")
        assert (r.status_code, r.json()["error"]) == (403, "FORBIDDEN")


@pytest.mark.slow
def test_producer_cannot_touch_another_principals_pid(make_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cl = make_cluster(servers=1, env=auth_env(tmp_path))
    url = cl.coordinator_url
    admin, p1, p2 = client(url, ADMIN_TOKEN), client(url, P1_TOKEN), client(url, P2_TOKEN)
    assert admin.post("/v1/topics", json={"name": "orders", "partitions": 1}).status_code == 200
    first = lease(p1, producer_name="job-a").json()
    pid, gen = first["pid"], first["generation"]
    view = admin.get(f"/v1/pids/{pid}").json()
    assert view["owner"] == "p1" and view["generation"] == gen

    refused = {
        "renew": lease(p2, pid=pid, generation=gen),
        "takeover by pid": lease(p2, pid=pid),
        "takeover by name": lease(p2, producer_name="job-a"),
        "read": p2.get(f"/v1/pids/{pid}"),
        "batch item": p2.post(
            "/v1/lease_pid/batch",
            json={"requests": [{"topic": "orders", "partition": 0, "pid": pid}]},
        ),
    }
    for what, r in refused.items():
        body = r.json()
        if what == "batch item":
            assert r.status_code == 200 and body["responses"][0]["error"] == "FORBIDDEN", r.text
            body = body["responses"][0]
        else:
            assert (r.status_code, body["error"]) == (403, "FORBIDDEN"), (what, r.text)
        assert "'p1'" in body["detail"] and "'p2'" in body["detail"], body
    # the SDK surfaces it as errors.Forbidden, at once (not retried until a timeout)
    started = time.monotonic()
    with pytest.raises(errors.Forbidden):
        Producer(url, "orders", producer_name="job-a", api_token=P2_TOKEN, start_timeout_ms=60_000)
    assert time.monotonic() - started < 20
    with LeaseClient(url, api_token=P2_TOKEN) as sdk:
        with pytest.raises(errors.Forbidden):
            sdk.lease("orders", 0, pid, generation=gen)
        with pytest.raises(errors.Forbidden):
            sdk.pids()
    after = admin.get(f"/v1/pids/{pid}").json()
    assert (after["generation"], after["expires_at_ms"]) == (gen, first["expires_at_ms"]), (
        "a refused renew/takeover changed the PID"
    )

    # the owner renews and takes over its own PID; an admin may take over anyone's
    assert lease(p1, pid=pid, generation=gen).json()["kind"] == "renew"
    taken = lease(admin, producer_name="job-a").json()
    assert (taken["kind"], taken["pid"], taken["generation"]) == ("takeover", pid, gen + 1)
    assert admin.get(f"/v1/pids/{pid}").json()["owner"] == "p1", "a takeover keeps the owner"
    assert lease(p1, pid=pid).json()["generation"] == gen + 2
    assert lease(p1, producer_name="job-a").json()["generation"] == gen + 3
    assert lease(admin, pid=pid, generation=gen + 3).json()["kind"] == "renew"
    for who in (p1, admin):
        item = who.post(
            "/v1/lease_pid/batch",
            json={
                "requests": [{"topic": "orders", "partition": 0, "pid": pid, "generation": gen + 3}]
            },
        ).json()
        assert item["responses"][0]["kind"] == "renew", item
        assert who.get(f"/v1/pids/{pid}").json()["owner"] == "p1"
    assert lease(admin, pid=pid).json()["generation"] == gen + 4
    listed = {p["pid"]: p["owner"] for p in admin.get("/v1/pids").json()["pids"]}
    assert listed[pid] == "p1"
    assert lease(p2).json()["pid"] in {p["pid"] for p in admin.get("/v1/pids").json()["pids"]}


@pytest.mark.slow
def test_dashboard_needs_an_admin_token_header_or_cookie(make_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cl = make_cluster(servers=1, env=auth_env(tmp_path))
    url = cl.coordinator_url
    with httpx.Client(base_url=url, timeout=30) as browser:
        assert browser.get("/dashboard").status_code == 401
        assert browser.get("/dashboard/data").status_code == 401
        r = browser.get("/dashboard", params={"token": P1_TOKEN})
        assert (r.status_code, r.json()["error"]) == (403, "FORBIDDEN")
        r = browser.get("/dashboard", params={"token": "wrong-token-123"})
        assert (r.status_code, r.json()["error"]) == (401, "UNAUTHORIZED")
        assert not browser.cookies
        r = browser.get("/dashboard", params={"token": ADMIN_TOKEN})
        assert r.status_code == 303 and r.headers["location"] == "/dashboard"
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/dashboard" in cookie
        assert ADMIN_TOKEN not in r.headers["location"]
        page = browser.get("/dashboard")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        data = browser.get("/dashboard/data")
        assert data.status_code == 200 and "counts" in data.json()
        # the cookie is for the dashboard only, never for the API
        assert browser.get("/v1/pids").status_code == 401
    with client(url, ADMIN_TOKEN) as c:
        assert c.get("/dashboard").status_code == 200
        assert c.get("/dashboard/data").status_code == 200
    with client(url, P1_TOKEN) as c:
        assert c.get("/dashboard/data").status_code == 403


def _zk_counts(zk_hosts: str, principal: str) -> tuple[int, int]:
    """(the principal's counter in ZooKeeper, PID records it owns)."""
    zk = connect_zk(zk_hosts)
    try:
        counter = int(zk.get(principal_path(principal))[0])
        owned = 0
        for child in zk.get_children(layout.PIDS):
            record = json.loads(zk.get(layout.pid_path(int(child)))[0])
            owned += record.get("owner") == principal
        return counter, owned
    finally:
        zk.stop()
        zk.close()


def _bodies(n: int, prefix: str) -> list[dict[str, Any]]:
    # half anonymous new PIDs, half new producer names: both create a PID
    return [
        {
            "topic": "orders",
            "partition": 0,
            "pid": -1,
            **({"producer_name": f"{prefix}-{i}"} if i % 2 else {}),
        }
        for i in range(n)
    ]


@pytest.mark.slow
def test_pid_limit_is_exact_across_two_coordinators(make_cluster, tmp_path, zk_hosts) -> None:  # type: ignore[no-untyped-def]
    limit = 7
    cl = make_cluster(
        servers=1,
        coordinators=2,
        env=auth_env(tmp_path, PIDLEASE_PIDS_MAX_PER_PRINCIPAL=str(limit)),
    )
    urls = [c.url for c in cl.coordinators]
    admin = client(urls[0], ADMIN_TOKEN)
    assert admin.post("/v1/topics", json={"name": "orders", "partitions": 1}).status_code == 200

    async def both(bodies: list[dict[str, Any]], token: str, **kw: Any) -> list[Reply]:
        half = len(bodies) // 2
        auth = {"authorization": f"Bearer {token}"}
        a, b = await asyncio.gather(
            run_many(urls[0], bodies[:half], connections=8, headers=auth, **kw),
            run_many(urls[1], bodies[half:], connections=8, headers=auth, **kw),
        )
        return a + b

    replies = asyncio.run(both(_bodies(40, "p1-job"), P1_TOKEN))
    ok = [r for r in replies if r.status == 200]
    refused = [r for r in replies if r.status == 429]
    assert len(ok) == limit and len(refused) == 40 - limit, [(r.status, r.body) for r in replies]
    for r in refused:
        assert r.body["error"] == "PID_LIMIT_EXCEEDED"
        for word in (
            "'p1'",
            f"holds {limit}",
            f"is {limit}",
            "pids_max_per_principal",
            "producer names",
            "retention",
        ):
            assert word in r.body["detail"], r.body
    assert _zk_counts(zk_hosts, "p1") == (limit, limit)
    # renewals and takeovers never count; another principal has its own allowance
    named = next(r.body for r in ok if r.body["producer_name"])
    p1 = client(urls[1], P1_TOKEN)
    assert lease(p1, producer_name=named["producer_name"]).json()["kind"] == "takeover"
    plain = next(r.body for r in ok if not r.body["producer_name"])
    assert lease(p1, pid=plain["pid"]).json()["kind"] == "takeover"
    assert lease(p1).status_code == 429
    started = time.monotonic()
    with pytest.raises(errors.PidLimitExceeded):
        Producer(urls[1], "orders", api_token=P1_TOKEN, start_timeout_ms=60_000)
    assert time.monotonic() - started < 20, "PID_LIMIT_EXCEEDED was retried"
    assert _zk_counts(zk_hosts, "p1") == (limit, limit)

    # p2 with one coordinator SIGKILLed mid-run: the count still matches the records
    async def killed_mid_run() -> None:
        killed = asyncio.Event()

        def on_reply(_: Reply) -> None:
            if not killed.is_set():
                killed.set()
                cl.kill(cl.coordinators[0])

        auth = {"authorization": f"Bearer {P2_TOKEN}"}
        bodies = _bodies(30, "p2-job")
        await asyncio.gather(
            run_many(
                urls[0],
                bodies[:15],
                connections=8,
                headers=auth,
                attempts_max=3,
                on_reply=on_reply,
                timeout_s=10,
            ),
            run_many(urls[1], bodies[15:], connections=8, headers=auth),
        )

    asyncio.run(killed_mid_run())
    p2 = client(urls[1], P2_TOKEN)
    for _ in range(2 * limit):
        if lease(p2).status_code == 429:
            break
    assert lease(p2).json()["error"] == "PID_LIMIT_EXCEEDED"
    assert _zk_counts(zk_hosts, "p2") == (limit, limit)


@pytest.mark.slow
def test_a_pid_swept_past_retention_frees_its_slot(make_cluster, tmp_path, zk_hosts) -> None:  # type: ignore[no-untyped-def]
    cl = make_cluster(
        servers=1,
        env=auth_env(
            tmp_path,
            PIDLEASE_PIDS_MAX_PER_PRINCIPAL="1",
            PIDLEASE_PID_RETENTION_MS="0",
            PIDLEASE_PID_SWEEP_INTERVAL_MS="100",
            PIDLEASE_LEASE_EXPIRE_MS_MIN="100",
        ),
    )
    url = cl.coordinator_url
    admin, p1 = client(url, ADMIN_TOKEN), client(url, P1_TOKEN)
    assert admin.post("/v1/topics", json={"name": "orders", "partitions": 1}).status_code == 200
    first = lease(p1, expire_ms=300)
    assert first.status_code == 200
    assert lease(p1, expire_ms=300).status_code == 429
    deadline = time.monotonic() + 30
    while True:
        r = lease(p1, producer_name="after-sweep", expire_ms=60_000)
        if r.status_code == 200:
            break
        assert r.json()["error"] == "PID_LIMIT_EXCEEDED", r.text
        assert time.monotonic() < deadline, "the swept PID never freed its slot"
        time.sleep(0.2)
    assert admin.get(f"/v1/pids/{first.json()['pid']}").status_code == 404
    assert _zk_counts(zk_hosts, "p1") == (1, 1)
    assert lease(p1).status_code == 429
