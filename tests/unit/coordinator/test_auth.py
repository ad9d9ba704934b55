"""Principals and scopes (coordinator/auth.py), the settings that configure them, and the
per-principal PID count of the lease service as a hypothesis property over a fake
ZooKeeper store with transactions (the real-ZooKeeper tests are in
tests/integration/test_coordinator_scopes.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from coordinator import auth
from coordinator.allocator import PidAllocator
from coordinator.leases import LeaseRequest, OwnedPidRecord, owner_of, record_from_bytes
from coordinator.metrics import Metrics
from coordinator.service import LeaseService
from coordinator.settings import CoordinatorSettings
from coordinator.store import principal_path
from coordinator.testing import FakeStore
from pidlease.errors import Forbidden, PidLimitExceeded
from pidlease.wire import cluster
from pidlease.wire.cluster import PidRecord, TopicSpec

# -- parsing -----------------------------------------------------------------------------------


def test_the_list_form_gives_named_principals_with_scopes() -> None:
    got = auth.parse_list(" ops:admin:tok-admin-1 , p1:producer:tok:with:colons ,")
    assert [(p.name, p.scope) for p in got] == [("ops", "admin"), ("p1", "producer")]
    a = auth.Authenticator(got)
    assert a.by_token("tok:with:colons").name == "p1"  # type: ignore[union-attr]
    assert a.by_token("tok-admin-1").name == "ops"  # type: ignore[union-attr]
    assert a.by_token("tok-admin-") is None and a.by_token("") is None


@pytest.mark.parametrize(
    ("entry", "complaint"),
    [
        ("p1:producer", "expected name:scope:token"),
        ("p1", "expected name:scope:token"),
        ("p 1:producer:long-enough", "principal name"),
        (":producer:long-enough", "principal name"),
        ("p1:root:long-enough", "scope 'root'"),
        ("p1:producer:short", "at least 8"),
        ("p1:producer:has space in it", "without spaces"),
        ("anonymous:admin:long-enough", "reserved"),
    ],
)
def test_a_malformed_entry_is_refused_with_where_and_what(entry: str, complaint: str) -> None:
    with pytest.raises(auth.PrincipalConfigError) as err:
        auth.parse_list(f"ok:admin:fine-token-1,{entry}")
    assert "api_tokens entry 2" in str(err.value) and complaint in str(err.value)


def test_clashing_names_and_tokens_are_refused() -> None:
    with pytest.raises(auth.PrincipalConfigError, match="configured twice"):
        auth.build_principals(api_tokens="a:admin:token-one-1,a:producer:token-two-2")
    with pytest.raises(auth.PrincipalConfigError, match="same token"):
        auth.build_principals(api_tokens="a:admin:token-one-1,b:producer:token-one-1")
    with pytest.raises(auth.PrincipalConfigError, match="api_token is the principal 'admin'"):
        auth.build_principals(api_token="legacy-token", api_tokens="admin:admin:token-two-2")


def test_the_file_form_skips_comments_and_names_the_bad_line(tmp_path: Any) -> None:
    f = tmp_path / "tokens"
    f.write_text("# ops\n\nops:admin:file-admin-token\n  p9:producer:file-prod-token\n")
    got = auth.build_principals(api_token="legacy-token", api_tokens_file=str(f))
    assert [(p.name, p.scope) for p in got] == [
        ("admin", "admin"),
        ("ops", "admin"),
        ("p9", "producer"),
    ]
    f.write_text("ops:admin:file-admin-token\n\np9:writer:file-prod-token\n")
    with pytest.raises(auth.PrincipalConfigError, match=r"line 3: .*scope 'writer'"):
        auth.parse_file(f)
    with pytest.raises(auth.PrincipalConfigError, match="cannot be read"):
        auth.parse_file(tmp_path / "missing")


def test_settings_refuse_a_malformed_principal_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIDLEASE_API_TOKENS", "p1:producer")
    with pytest.raises(ValidationError, match="expected name:scope:token"):
        CoordinatorSettings()
    monkeypatch.setenv("PIDLEASE_API_TOKENS", "ok:admin:very-secret-1,p1:writer:very-secret-2")
    with pytest.raises(ValidationError, match="entry 2: principal 'p1' has scope 'writer'") as err:
        CoordinatorSettings()
    assert "very-secret" not in str(err.value), "the message must not print the tokens"
    monkeypatch.setenv("PIDLEASE_API_TOKENS", "p1:producer:good-token-1")
    monkeypatch.setenv("PIDLEASE_API_TOKEN", "legacy")
    assert [(p.name, p.scope) for p in CoordinatorSettings().principals()] == [
        ("admin", "admin"),
        ("p1", "producer"),
    ]


def test_bearer_header_parsing() -> None:
    a = auth.Authenticator(auth.parse_list("p1:producer:good-token-1"))
    assert a.enabled and not auth.Authenticator([]).enabled
    assert a.by_authorization(b"Bearer good-token-1").name == "p1"  # type: ignore[union-attr]
    assert a.by_authorization(b"bearer good-token-1") is not None
    for bad in (b"good-token-1", b"Basic good-token-1", b"Bearer ", b"Bearer good-token-2", b""):
        assert a.by_authorization(bad) is None, bad


# -- the scope table ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path", "scope"),
    [
        ("POST", "/v1/lease_pid", "producer"),
        ("POST", "/v1/lease_pid/batch", "producer"),
        ("GET", "/v1/topics", "producer"),
        ("GET", "/v1/topics/orders", "producer"),
        ("GET", "/v1/pids/42", "producer"),
        ("POST", "/v1/topics", "admin"),
        ("PATCH", "/v1/topics/orders", "admin"),  # reading a topic is a producer's, changing not
        ("GET", "/v1/pids", "admin"),
        ("GET", "/v1/servers", "producer"),  # a group member finds the Kafka listeners
        ("GET", "/v1/coordinators", "admin"),
        ("GET", "/v1/lease_pid", "admin"),  # wrong method: not a producer route
        ("GET", "/v1/topics/a/b", "admin"),  # not one segment
        ("GET", "/v1/topics/", "admin"),
        ("GET", "/v1/whatever", "admin"),
        ("GET", "/v1", "admin"),
        ("GET", "/dashboard", "admin"),
        ("GET", "/dashboard/data", "admin"),
        ("GET", "/dashboard/static/dashboard.js", None),
        ("GET", "/healthz", None),
        ("GET", "/metrics", None),
        ("GET", "/openapi.json", None),
        ("GET", "/v1x", None),
    ],
)
def test_scope_table(method: str, path: str, scope: str | None) -> None:
    assert auth.required_scope(method, path) == scope


def test_admin_allows_everything_producer_only_producer() -> None:
    admin, prod = auth.Principal("a", "admin"), auth.Principal("p", "producer")
    assert admin.allows("admin") and admin.allows("producer") and admin.allows(None)
    assert prod.allows("producer") and prod.allows(None) and not prod.allows("admin")
    assert auth.ANONYMOUS.is_admin


def test_owner_is_kept_in_the_record_only_when_not_anonymous() -> None:
    plain = PidRecord(pid=3, generation=1)
    assert owner_of(plain) == "anonymous"
    assert b"owner" not in OwnedPidRecord(pid=3, generation=1).to_bytes()
    owned = OwnedPidRecord(pid=3, generation=1, owner="p1")
    back = record_from_bytes(owned.to_bytes())
    assert owner_of(back) == "p1" and back == owned
    assert type(record_from_bytes(plain.to_bytes())) is PidRecord


# -- the PID count, as a property --------------------------------------------------------------
class TxStore(FakeStore):
    """coordinator.testing.FakeStore with the counted create and the counted delete as atomic
    transactions on versions, and a topic "t" of one partition."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes[cluster.topic_path("t")] = (TopicSpec("t", 1).to_bytes(), 0)

    def get_principal_count(self, principal: str) -> tuple[int, int] | None:
        got = self._get(principal_path(principal))
        return None if got is None else (int(got[0]), got[1])

    def count_owned_pids(self, principal: str) -> int:
        return sum(owner_of(r) == principal for r, _ in self.get_pids(self.list_pid_ids()))

    def create_pid_counted(
        self,
        record: PidRecord,
        name: str | None,
        name_version: int | None,
        principal: str,
        count: int,
        count_version: int | None,
    ) -> str:
        with self.lock:
            if name is not None:
                cur = self.nodes.get(cluster.name_path(name))
                if (cur is None) != (name_version is None) or (cur and cur[1] != name_version):
                    return "name"
            cpath = principal_path(principal)
            cur = self.nodes.get(cpath)
            if (cur is None) != (count_version is None) or (cur and cur[1] != count_version):
                return "counter"
            self.nodes[cluster.pid_path(record.pid)] = (record.to_bytes(), 0)
            if name is not None:
                old = self.nodes.get(cluster.name_path(name))
                self.nodes[cluster.name_path(name)] = (
                    str(record.pid).encode(),
                    0 if old is None else old[1] + 1,
                )
            self.nodes[cpath] = (str(count).encode(), 0 if cur is None else cur[1] + 1)
            return "ok"

    def delete_pid(self, record: PidRecord, version: int) -> bool:
        with self.lock:  # re-entrant: the delete and the count change are one step
            if not super().delete_pid(record, version):
                return False
            cpath = principal_path(owner_of(record))
            if cpath in self.nodes:
                n, v = self.nodes[cpath]
                self.nodes[cpath] = (str(max(0, int(n) - 1)).encode(), v + 1)
            return True


PRINCIPALS = [
    auth.Principal("p1", "producer"),
    auth.Principal("p2", "producer"),
    auth.Principal("ops", "admin"),
]
OPS = st.one_of(
    st.tuples(st.just("lease"), st.integers(0, 2), st.one_of(st.none(), st.sampled_from("abcd"))),
    st.tuples(st.just("wait"), st.integers(1, 400), st.none()),
    st.tuples(st.just("sweep"), st.just(0), st.none()),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(limit=st.integers(1, 4), ops=st.lists(OPS, max_size=40))
def test_the_count_always_equals_the_pids_a_principal_owns(limit: int, ops: list[Any]) -> None:
    now = [1_000_000]
    store = TxStore()
    cfg = CoordinatorSettings(
        zk="x",
        pids_max_per_principal=limit,
        lease_expire_ms_min=100,
        lease_expire_ms_default=100,
        pid_retention_ms=100,
    )
    svc = LeaseService(
        cfg,
        store,
        PidAllocator(store, 3),
        None,
        Metrics(),  # type: ignore[arg-type]
        clock_ms=lambda: now[0],
    )
    try:
        for op, arg, name in ops:
            if op == "wait":
                now[0] += arg
            elif op == "sweep":
                svc.sweep()
            else:
                who = PRINCIPALS[arg]
                bound = store.get_name(name) if name else None
                if bound is not None:
                    got = store.get_pid(bound[0])
                    if got is not None and now[0] < got[0].expires_at_ms + 100:
                        if owner_of(got[0]) != who.name and not who.is_admin:
                            with pytest.raises(Forbidden):
                                svc.lease(LeaseRequest("t", 0, producer_name=name), who)
                        continue  # a takeover: needs partition leaders, tested elsewhere
                held = store.count_owned_pids(who.name)
                request = LeaseRequest("t", 0, producer_name=name)
                if held < limit:
                    svc.lease(request, who)  # under the limit: a new PID, never a refusal
                else:
                    with pytest.raises(PidLimitExceeded) as refused:  # no new PID past the limit
                        svc.lease(request, who)
                    extra = refused.value.extra
                    assert extra == {"principal": who.name, "count": held, "limit": limit}
            for p in PRINCIPALS:
                counted = store.get_principal_count(p.name)
                owned = store.count_owned_pids(p.name)
                assert owned <= limit
                assert (counted[0] if counted else 0) == owned, (p.name, ops)
    finally:
        svc.close()


# -- the guard, in process ---------------------------------------------------------------------
def _guarded(principals: str) -> Any:
    from coordinator.guard import Guard

    async def app(scope: Any, receive: Any, send: Any) -> None:
        who = scope["state"]["principal"]
        body = json.dumps({"error": "NONE", "principal": who.name if who else None}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return Guard(
        app,
        bytes_max=4096,
        principals=auth.parse_list(principals),
        on_unexpected=lambda exc: (503, {"error": "COORDINATOR_UNAVAILABLE"}),
    )


def _get(guard: Any, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=guard), base_url="http://127.0.0.1"
        ) as c:
            return await c.get(path, headers=headers or {})

    return asyncio.run(go())


def test_guard_answers_401_403_and_passes_the_principal_on() -> None:
    g = _guarded("ops:admin:admin-token-1,p1:producer:prod-token-1")
    assert (
        _get(g, "/v1/topics", {"authorization": "Bearer prod-token-1"}).json()["principal"] == "p1"
    )
    r = _get(g, "/v1/pids", {"authorization": "Bearer prod-token-1"})
    assert r.status_code == 403 and r.json()["error"] == "FORBIDDEN"
    assert r.json()["needed_scope"] == "admin" and "needs scope 'admin'" in r.json()["detail"]
    assert (
        _get(g, "/v1/pids", {"authorization": "Bearer admin-token-1"}).json()["principal"] == "ops"
    )
    for headers in (
        {},
        {"authorization": "Bearer nope-nope-1"},
        {"authorization": "admin-token-1"},
        {"authorization": "Bearer \x7f\x01"},
    ):
        r = _get(g, "/v1/topics", headers)
        assert (r.status_code, r.json()["error"]) == (401, "UNAUTHORIZED"), headers
    assert _get(g, "/healthz").json()["principal"] is None  # open: no principal needed


def test_guard_dashboard_cookie_is_checked_and_only_for_the_dashboard() -> None:
    g = _guarded("ops:admin:admin-token-1,p1:producer:prod-token-1")
    cookie = {"cookie": f"{auth.COOKIE_NAME}=admin-token-1"}
    assert _get(g, "/dashboard/data", cookie).json()["principal"] == "ops"
    assert _get(g, "/v1/pids", cookie).status_code == 401
    assert _get(g, "/dashboard", {"cookie": f"{auth.COOKIE_NAME}=prod-token-1"}).status_code == 403
    for junk in ('=;;="', f"{auth.COOKIE_NAME}=", f'{auth.COOKIE_NAME}="unterminated', "\x00"):
        r = _get(g, "/dashboard", {"cookie": junk})
        assert r.status_code == 401, junk
    r = _get(g, "/dashboard?token=admin-token-1")
    assert r.status_code == 303 and r.headers["location"] == "/dashboard"
    assert "HttpOnly" in r.headers["set-cookie"] and "SameSite=Strict" in r.headers["set-cookie"]


def test_guard_without_principals_is_open_as_anonymous_admin() -> None:
    g = _guarded("")
    for path in ("/v1/pids", "/dashboard", "/v1/topics"):
        assert _get(g, path).json()["principal"] == "anonymous"


def test_own_login_is_the_first_admin_principal(tmp_path: Path) -> None:
    from coordinator.auth import own_login

    assert own_login() is None
    assert own_login("legacy-token-1234") == ("admin", "legacy-token-1234")
    tokens = "alice:producer:alice-token-123,root:admin:root:token-789"
    assert own_login("", tokens) == ("root", "root:token-789")
    assert own_login("", "alice:producer:alice-token-123") == ("alice", "alice-token-123")
    f = tmp_path / "tokens"
    f.write_text("# ops\nbob:producer:bob-token-4567\nops:admin:ops-token-0000\n")
    assert own_login("", "alice:producer:alice-token-123", str(f)) == ("ops", "ops-token-0000")
