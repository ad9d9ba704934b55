"""The security matrix as built, on real processes: the coordinator's legacy single bearer
token (``PIDLEASE_API_TOKEN``, the admin principal "admin"; none / wrong / right, on every
kind of route; named principals and scopes are in
tests/integration/test_coordinator_scopes.py), its request size limit, and the
lease tokens a partition server requires for idempotent appends and fences (missing,
malformed, forged, expired, another PID's, another generation's). Every refused append
must leave the log unchanged. The observed matrix is printed for docs/reliability.md."""

from __future__ import annotations

import socket
import time

import pytest

from pidlease import errors
from pidlease.client.producer import Producer
from pidlease.testing.devcluster import DEV_SECRET, http_json
from pidlease.testing.wire import WireClient, batch, create_topic, token
from pidlease.wire.token import make_token

API_TOKEN = "s3cret-api-token"
UNAUTHORIZED = errors.Unauthorized.code
ROUTES = [
    ("GET", "/v1/topics", None),
    ("POST", "/v1/topics", {"name": "t2", "partitions": 1}),
    ("POST", "/v1/lease_pid", {"topic": "orders", "partition": 0, "pid": -1}),
    ("POST", "/v1/lease_pid/batch", {"requests": [{"topic": "orders", "partition": 0, "pid": -1}]}),
    ("GET", "/v1/pids", None),
    ("GET", "/healthz", None),
    ("GET", "/metrics", None),
    ("GET", "/openapi.json", None),
    ("GET", "/dashboard", None),
    ("GET", "/dashboard/data", None),
]
# needs the token: /v1 and the dashboard (page and data); open: health, metrics, schema
GUARDED = ("/v1/", "/dashboard")


def call(url: str, method: str, path: str, body: dict | None, auth: str | None) -> int:
    import urllib.request

    data = None if body is None else __import__("json").dumps(body).encode()
    headers = {"content-type": "application/json"}
    if auth is not None:
        headers["authorization"] = auth
    req = urllib.request.Request(url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        exc.read()
        return int(exc.code)


@pytest.mark.slow
def test_api_token_matrix(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(servers=1, env={"PIDLEASE_API_TOKEN": API_TOKEN})
    url = cluster.coordinator_url
    status, answer = http_json("POST", url + "/v1/topics", {"name": "orders", "partitions": 1})
    assert status == 401 and answer["error"] == "UNAUTHORIZED", answer
    assert (
        call(url, "POST", "/v1/topics", {"name": "orders", "partitions": 1}, f"Bearer {API_TOKEN}")
        == 200
    )
    rows = []
    for method, path, body in ROUTES:
        got = {
            name: call(url, method, path, body, auth)
            for name, auth in [
                ("none", None),
                ("wrong", "Bearer nope"),
                ("right", f"Bearer {API_TOKEN}"),
            ]
        }
        rows.append(f"| {method} {path} | {got['none']} | {got['wrong']} | {got['right']} |")
        assert all(s < 500 for s in got.values()), (path, got)
        if path.startswith(GUARDED):
            assert got["none"] == 401 and got["wrong"] == 401, (path, got)
            assert got["right"] in (200, 409), (path, got)
        else:
            assert set(got.values()) == {200}, (path, got)
    print(
        "AUTH MATRIX (API token configured)\n| route | no token | wrong token | right token |\n"
        + "\n".join(rows)
    )
    with pytest.raises(errors.Unauthorized):
        Producer(url, "orders", api_token="nope", start_timeout_ms=10_000)
    with Producer(url, "orders", api_token=API_TOKEN) as p:
        assert p.send(b"ok").result(timeout=60).offset >= 0
    # request size limit: a declared body over it is answered 413 from the headers alone
    # (a raw socket, so the client is not racing the early answer with a 2 MiB send)
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(
            b"POST /v1/topics HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer " + API_TOKEN.encode() + b"\r\n"
            b"content-length: 2097152\r\n\r\n" + b"{" * 1024
        )
        status_line = s.recv(4096).split(b"\r\n", 1)[0]
    assert status_line.split()[1] == b"413", status_line


@pytest.mark.slow
def test_lease_token_matrix(make_cluster, zk_hosts: str) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(servers=1, coordinators=0)
    create_topic(zk_hosts, "auth")
    svc = cluster.servers[0]
    now_ms = int(time.time() * 1000)
    pid, gen = 41, 7
    cases = {
        "valid": token(DEV_SECRET, pid, gen),
        "missing": "",
        "malformed": "not-a-token",
        "forged (other secret)": make_token(b"attacker-secret", pid, gen, now_ms + 3_600_000),
        "forged (signature edited)": token(DEV_SECRET, pid, gen)[:-4] + "0000",
        "expired": make_token(DEV_SECRET.encode(), pid, gen, now_ms - 1_000),
        "other PID": token(DEV_SECRET, pid + 1, gen),
        "other generation": token(DEV_SECRET, pid, gen + 1),
    }
    rows = []
    with WireClient(svc.address) as c:
        for name, tok in cases.items():
            seq = 0 if name == "valid" else 1
            r = c.produce("auth", 0, batch(pid, gen, seq, [name.encode()]), tok)
            f = c.fence("auth", 0, pid, gen, tok)
            rows.append(
                f"| {name} | {errors.error_for_code(r.error_code).name if r.error_code else 'OK'} "
                f"| {errors.error_for_code(f.error_code).name if f.error_code else 'OK'} |"
            )
            if name == "valid":
                assert r.error_code == 0, r
            else:
                assert r.error_code == UNAUTHORIZED, (name, r)
                assert f.error_code == UNAUTHORIZED, (name, f)
        r0 = c.produce("auth", 0, batch(0, 0, 0, [b"pid-0"]), "")
        rows.append(
            f"| PID 0 (not idempotent), no token | "
            f"{errors.error_for_code(r0.error_code).name if r0.error_code else 'OK'} | - |"
        )
        values = [rec.value for rec in c.read_all("auth", 0) if not rec.is_control]
    print("LEASE TOKEN MATRIX\n| token | PRODUCE | FENCE |\n" + "\n".join(rows))
    assert b"valid" in values
    assert not any(v in values for v in [n.encode() for n in cases if n != "valid"]), values
