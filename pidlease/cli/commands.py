"""The ``pidlease`` command: a local cluster, topics, producing, consuming, the PID expiry
table, the exactly-once audit and the demo. One ``cmd_*`` function per subcommand; each
returns the exit code. Errors from the cluster become one line on stderr saying what went
wrong and what to do, and exit code 1 (2 for a bad command line, as argparse does).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pidlease import errors
from pidlease.cli.units import (
    exact_bytes,
    exact_ms,
    human_bytes,
    parse_duration_ms,
    parse_retention_bytes,
    parse_retention_ms,
    parse_segment_bytes,
    parse_segment_ms,
    parse_start,
    parse_time_ms,
)
from pidlease.cli.units import human_ms as _human_ms

ENV_COORDINATOR = "PIDLEASE_COORDINATOR"
ENV_ZK = "PIDLEASE_ZK"
DEFAULT_COORDINATOR = "http://127.0.0.1:8470"

EPILOG = """\
examples:
  pidlease dev up --servers 3 --detach          # a local cluster on 127.0.0.1, coordinator :8470
  pidlease topic create orders --partitions 3 --replication-factor 1 --dedup strict
  pidlease topic alter orders --retention 1d --retention-bytes 10GiB
  seq 1 1000 | pidlease produce orders --producer-name loader
  printf 'alice:hello\\nbob:hi\\n' | pidlease produce orders --key-separator :
  pidlease consume orders --partition 0 --from 0 --max 10
  pidlease consume orders --from-time 2026-11-24T10:00:00Z --follow
  pidlease pids --expiring-within 5m
  pidlease verify orders                         # exit 0 when exactly-once holds
  pidlease dev down
  pidlease demo --records 200000                 # the whole story under faults, about a minute

Every command that talks to a cluster takes --coordinator URL (env PIDLEASE_COORDINATOR,
default http://127.0.0.1:8470); commands that run a service take --zk HOSTS (env PIDLEASE_ZK).
"""

# Topic log settings: (flag, API field, parser, help); the same flags on create and alter.
LOG_SETTING_FLAGS: tuple[tuple[str, str, Callable[[str], int], str], ...] = (
    (
        "--retention",
        "retention_ms",
        parse_retention_ms,
        "delete whole old segments older than this: 7d, 12h, 30m, or forever",
    ),
    (
        "--retention-bytes",
        "retention_bytes",
        parse_retention_bytes,
        "per partition, delete old segments beyond this size: 1GiB, 500MB, or unlimited",
    ),
    (
        "--segment-bytes",
        "segment_bytes",
        parse_segment_bytes,
        "roll the active segment at this size, 4KiB..1GiB, or default (the server's)",
    ),
    (
        "--segment-ms",
        "segment_ms",
        parse_segment_ms,
        "roll the active segment when this old: 1h, 1d, or never",
    ),
    (
        "--min-insync-replicas",
        "min_insync_replicas",
        int,
        "in-sync replicas (leader included) a produce or fence needs, 1..replication factor "
        "(0: 1 for R<=2, 2 for R>=3); fewer in sync: NOT_ENOUGH_REPLICAS, nothing written",
    ),
)


def _table(rows: list[list[Any]], header: list[str]) -> str:
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in cells
    )


def _client(args: argparse.Namespace) -> Any:
    from pidlease.client.lease_client import LeaseClient

    return LeaseClient(
        args.coordinator,
        tls_ca_file=getattr(args, "tls_ca_file", None),
        api_token=getattr(args, "api_token", None),
    )


# -- cluster ---------------------------------------------------------------------------------
def cmd_dev_up(args: argparse.Namespace) -> int:
    from pidlease.cli import devctl

    return devctl.up(
        data_dir=Path(args.data_dir),
        servers=args.servers,
        replication_factor=args.replication_factor,
        zk_nodes=args.zk_nodes,
        port=args.port,
        zk_hosts=args.zk,
        detach=args.detach,
    )


def cmd_dev_down(args: argparse.Namespace) -> int:
    from pidlease.cli import devctl

    return devctl.down(data_dir=Path(args.data_dir))


def _service_env(args: argparse.Namespace, mapping: dict[str, str]) -> None:
    for attr, env in mapping.items():
        value = getattr(args, attr, None)
        if value is not None:
            os.environ[env] = str(value)


def cmd_coordinator(args: argparse.Namespace) -> int:
    _service_env(args, {"zk": "PIDLEASE_ZK", "port": "PIDLEASE_HTTP_PORT"})
    from coordinator.__main__ import main as run

    return int(run([]) or 0)


def cmd_partition_server(args: argparse.Namespace) -> int:
    _service_env(
        args,
        {
            "zk": "PIDLEASE_ZK",
            "port": "PIDLEASE_PORT",
            "kafka_port": "PIDLEASE_KAFKA_PORT",
            "server_id": "PIDLEASE_SERVER_ID",
            "data_dir": "PIDLEASE_DATA_DIR",
        },
    )
    from partition_server.__main__ import main as run

    return int(run() or 0)


# -- topics ----------------------------------------------------------------------------------
def _settings_line(body: dict[str, Any]) -> str:
    if "retention_ms" not in body:  # an older coordinator
        return "log settings: not reported by this coordinator"
    insync = body.get("min_insync_replicas", 0)
    effective = body.get("min_insync_replicas_effective", insync)
    segment_bytes = body.get("segment_bytes", 0)
    return (
        f"retention {exact_ms(body['retention_ms'])}, "
        f"retention bytes {exact_bytes(body.get('retention_bytes', -1))} per partition, "
        f"segment bytes {exact_bytes(segment_bytes) if segment_bytes else 'server default'}, "
        f"segment age {exact_ms(body.get('segment_ms', -1), minus_one='never')}, "
        f"min in-sync replicas {insync or f'default ({effective})'}"
    )


def _print_topic(body: dict[str, Any]) -> None:
    print(
        f"topic {body['name']}: {body['partitions']} partitions, replication factor "
        f"{body.get('replication_factor', 1)}, dedup {body.get('dedup', 'strict')}"
    )
    print(_settings_line(body))
    rows = [
        [
            p["partition"],
            p.get("leader"),
            p.get("leader_address") or "-",
            p.get("leader_epoch"),
            ",".join(map(str, p.get("replicas", []))),
            ",".join(map(str, p.get("isr", []))),
            p.get("log_start_offset", -1),
            p.get("log_end_offset"),
            p.get("high_watermark"),
            human_bytes(int(p.get("size_bytes", -1))),
            _deleted_cell(p),
        ]
        for p in body.get("partition_states", [])
    ]
    header = ["PARTITION", "LEADER", "ADDRESS", "EPOCH", "REPLICAS", "ISR"]
    print(_table(rows, [*header, "LOG_START", "LOG_END", "HW", "SIZE", "DELETED"]))


def _deleted_cell(p: dict[str, Any]) -> str:
    """What retention deleted on the leader since it started, as "segments (bytes)": one
    column for both keeps the table narrow; "-" when the leader does not report it."""
    if "segments_deleted" not in p:
        return "-"
    return f"{p['segments_deleted']} ({human_bytes(int(p.get('bytes_deleted', -1)))})"


def _log_settings(args: argparse.Namespace) -> dict[str, int]:
    """The log settings given on the command line, by API field."""
    return {
        field: getattr(args, field)
        for _, field, _, _ in LOG_SETTING_FLAGS
        if getattr(args, field, None) is not None
    }


def cmd_topic_create(args: argparse.Namespace) -> int:
    with _client(args) as c:
        body = c.create_topic(
            args.name,
            partitions=args.partitions,
            replication_factor=args.replication_factor,
            dedup=args.dedup,
            **_log_settings(args),
        )
    if args.json:
        print(json.dumps(body))
    else:
        print(f"created topic {args.name}")
        _print_topic(body)
    return 0


def cmd_topic_alter(args: argparse.Namespace) -> int:
    settings = _log_settings(args)
    if not settings:
        flags = ", ".join(flag for flag, _, _, _ in LOG_SETTING_FLAGS)
        print(f"error: nothing to change; give at least one of {flags}", file=sys.stderr)
        return 2
    with _client(args) as c:
        body = c.alter_topic(args.name, **settings)
    if args.json:
        print(json.dumps(body))
    else:
        print(f"altered topic {args.name}: {_settings_line(body)}")
    return 0


def cmd_topic_list(args: argparse.Namespace) -> int:
    with _client(args) as c:
        topics = c.topics()
    if args.json:
        print(json.dumps(topics))
        return 0
    if not topics:
        print("no topics yet; create one with: pidlease topic create NAME --partitions N")
        return 0
    print(
        _table(
            [
                [
                    t.get("name"),
                    t.get("partitions", "?"),
                    t.get("replication_factor", "?"),
                    t.get("dedup", "?"),
                ]
                for t in topics
            ],
            ["NAME", "PARTITIONS", "REPLICATION", "DEDUP"],
        )
    )
    return 0


def cmd_topic_describe(args: argparse.Namespace) -> int:
    """One page of partitions (``--from``, ``--limit``): a topic of 10,000 stays readable,
    and only the page's leaders are asked for offsets (``--no-offsets``: none)."""
    query = f"?first={args.first}&count={args.limit}"
    if args.no_offsets:
        query += "&offsets=false"
    with _client(args) as c:
        body = c.call("GET", f"/v1/topics/{args.name}{query}")
    if args.json:
        print(json.dumps(body))
        return 0
    _print_topic(body)
    shown = len(body.get("partition_states", []))
    total = int(body.get("partitions", 0))
    if args.first > 0 or args.first + shown < total:
        rest = f"; next: --from {args.first + shown}" if args.first + shown < total else ""
        print(f"partitions {args.first}-{args.first + shown - 1} of {total}{rest}")
    return 0


# -- consumer groups ---------------------------------------------------------------------------
def _consume_group(args: argparse.Namespace) -> int:
    """The partitions the group assigns, from its commits; commits after each poll. Without
    --follow it stops once a poll finds nothing (its share read to the end)."""
    from pidlease.client.consumer import Consumer

    n = 0
    with Consumer(
        args.coordinator,
        [args.topic],
        args.group,
        api_token=getattr(args, "api_token", None),
        tls_ca_file=getattr(args, "tls_ca_file", None),
    ) as c:
        while args.max is None or n < args.max:
            recs = c.poll(1.0, max_records=500 if args.max is None else min(500, args.max - n))
            if not recs and c.assignment and not args.follow:
                break
            for rec in recs:
                if args.json:
                    print(
                        json.dumps(
                            {
                                "partition": rec.partition,
                                "offset": rec.offset,
                                "key": _text(rec.key),
                                "value": _text(rec.value),
                                "timestamp_ms": rec.timestamp_ms,
                            }
                        )
                    )
                else:
                    print(f"{rec.partition}\t{rec.offset}\t{_text(rec.key)}\t{_text(rec.value)}")
                n += 1
            if recs:
                c.commit()
    print(f"{n} records", file=sys.stderr)
    return 0


def cmd_groups_list(args: argparse.Namespace) -> int:
    from pidlease.client.consumer import list_groups

    groups = list_groups(
        args.coordinator,
        api_token=getattr(args, "api_token", None),
        tls_ca_file=getattr(args, "tls_ca_file", None),
    )
    if args.json:
        print(json.dumps(groups))
    elif not groups:
        print("no consumer groups")
    else:
        rows = [[g["group"], g["protocol_type"], g["state"]] for g in groups]
        print(_table(rows, ["GROUP", "TYPE", "STATE"]))
    return 0


def cmd_groups_describe(args: argparse.Namespace) -> int:
    from pidlease.client.consumer import describe_group

    d = describe_group(
        args.coordinator,
        args.group,
        api_token=getattr(args, "api_token", None),
        tls_ca_file=getattr(args, "tls_ca_file", None),
    )
    if args.json:
        print(json.dumps(d))
        return 0
    print(f"group {d['group']}: {d['state']} ({d['protocol_type']} {d['protocol']})")
    for m in d["members"]:
        parts = " ".join(f"{t}:{','.join(map(str, ps))}" for t, ps in m["partitions"].items())
        print(f"  member {m['member_id']} ({m['client_id']}): {parts or '-'}")
    rows = [
        [o["topic"], o["partition"], o["committed"], o["high_watermark"], o["lag"]]
        for o in d["offsets"]
    ]
    if rows:
        print(_table(rows, ["TOPIC", "PARTITION", "COMMITTED", "HIGH WATERMARK", "LAG"]))
    return 0


def cmd_groups_delete(args: argparse.Namespace) -> int:
    from pidlease.client.consumer import delete_group

    delete_group(
        args.coordinator,
        args.group,
        api_token=getattr(args, "api_token", None),
        tls_ca_file=getattr(args, "tls_ca_file", None),
    )
    print(f"deleted group {args.group}")
    return 0


# -- data ------------------------------------------------------------------------------------
def cmd_produce(args: argparse.Namespace) -> int:
    from pidlease.client.producer import Producer

    sep = args.key_separator.encode() if args.key_separator else None
    stdin = sys.stdin.buffer
    futures: list[Any] = []
    bad_line = False
    with Producer(
        args.coordinator,
        topic=args.topic,
        producer_name=args.producer_name,
        linger_ms=args.linger_ms,
        max_in_flight=args.max_in_flight,
        tls_ca_file=args.tls_ca_file,
        api_token=args.api_token,
    ) as p:
        for raw in stdin:
            line = raw.rstrip(b"\r\n") if not args.keep_newlines else raw
            key = None
            if sep is not None:
                if sep not in line:
                    print(
                        f"error: line {len(futures) + 1} has no key separator "
                        f"{args.key_separator!r}; nothing more was sent",
                        file=sys.stderr,
                    )
                    bad_line = True
                    break
                key, line = line.split(sep, 1)
            futures.append(p.send(line, key=key, partition=args.partition))
        p.flush()
        pid, gen = p.pid, p.generation
    new = dup = 0
    failed: list[BaseException] = []
    per_partition: dict[int, int] = {}
    for f in futures:
        exc = f.exception()
        if exc is not None:
            failed.append(exc)
            continue
        md = f.result()
        per_partition[md.partition] = per_partition.get(md.partition, 0) + 1
        dup += md.duplicate
        new += not md.duplicate
    spread = ", ".join(f"p{k}: {v}" for k, v in sorted(per_partition.items())) or "none"
    name = f" (producer name {args.producer_name})" if args.producer_name else ""
    print(
        f"produced {new + dup} of {len(futures)} records to {args.topic} as pid {pid} generation "
        f"{gen}{name}: {new} new, {dup} duplicates, {len(failed)} failed; per partition {spread}"
    )
    if failed:
        print(f"error: {len(failed)} records failed, first: {failed[0]}", file=sys.stderr)
        return 1
    return 1 if bad_line else 0


def _text(b: bytes | None) -> str:
    return "" if b is None else b.decode(errors="replace")


def cmd_consume(args: argparse.Namespace) -> int:
    from pidlease.client.reader import Reader

    if args.group is not None:
        return _consume_group(args)
    n = 0
    start: dict[str, Any] = {}
    if args.from_time is not None:
        start["start_timestamp_ms"] = args.from_time
    elif isinstance(args.from_offset, str):
        start["start"] = args.from_offset
    else:
        start["start_offset"] = args.from_offset
    with Reader(
        args.coordinator,
        args.topic,
        args.partition,
        **start,
        stop_at_end=not args.follow,
        include_control=args.include_control,
        tls_ca_file=args.tls_ca_file,
        api_token=args.api_token,
    ) as rd:
        for rec in rd:
            if args.max is not None and n >= args.max:
                break
            if args.json:
                print(
                    json.dumps(
                        {
                            "offset": rec.offset,
                            "pid": rec.pid,
                            "generation": rec.generation,
                            "sequence_id": rec.sequence_id,
                            "key": _text(rec.key),
                            "value": _text(rec.value),
                            "timestamp_ms": rec.timestamp_ms,
                            "control": rec.is_control,
                        }
                    )
                )
            else:
                print(f"{rec.offset}\t{_text(rec.key)}\t{_text(rec.value)}")
            n += 1
    print(f"{n} records", file=sys.stderr)
    return 0


def cmd_pids(args: argparse.Namespace) -> int:
    """The terminal's PID-expiry table: what /dashboard shows, soonest expiry first."""
    with _client(args) as c:
        params: dict[str, Any] = {"limit": args.limit}
        if args.state:
            params["state"] = args.state
        if args.not_writing:
            params["not_writing"] = "true"
            params["idle_ms"] = args.idle
        if args.filter:
            params["q"] = args.filter
        body = c.call("GET", "/v1/pids", params=params)
        pids = list(body.get("pids", []))
    if args.expiring_within is not None:
        # Still running and out within DURATION: lapsed leases are not "expiring" any more.
        pids = [p for p in pids if 0 < p.get("expires_in_ms", 0) <= args.expiring_within]
    pids.sort(key=lambda p: p.get("expires_in_ms", 0))
    if args.json:
        print(json.dumps(pids))
        return 0
    now_ms = int(time.time() * 1000)
    rows = [
        [
            p["pid"],
            p.get("producer_name") or "-",
            p.get("generation"),
            p.get("state"),
            _human_ms(int(p.get("expires_in_ms", 0))),
            _human_ms(max(0, now_ms - int(p.get("last_use_ms", now_ms)))) + " ago",
            _last_append(p, now_ms),
            "-" if p.get("append_lag_ms") is None else _human_ms(int(p["append_lag_ms"])),
            ",".join(
                f"{q['topic']}/{q['partition']}@{_highwater(q)}" for q in p.get("partitions", [])
            )
            or "-",
        ]
        for p in pids
    ]
    print(
        _table(
            rows,
            [
                "PID",
                "NAME",
                "GENERATION",
                "STATE",
                "EXPIRES_IN",
                "LAST_USE",
                "LAST_APPEND",
                "APPEND_LAG",
                "PARTITIONS(topic/p@highwater)",
            ],
        )
    )
    counts = {
        s: sum(1 for p in pids if p.get("state") == s) for s in ("active", "expiring", "lapsed")
    }
    print(f"{len(rows)} PIDs: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    if body.get("age_ms") is not None:
        print(f"highwaters as of {_human_ms(int(body['age_ms']))} ago", file=sys.stderr)
    for gone in body.get("leaders_unreachable") or ():
        print(f"server {gone['server_id']} unreachable: {gone['detail']}", file=sys.stderr)
    if body.get("matched", 0) > len(pids) and args.expiring_within is None:
        print(f"first {len(pids)} of {body['matched']}: raise --limit", file=sys.stderr)
    return 0


def _highwater(part: dict[str, Any]) -> str:
    """A partition's live highwater, or why there is none (as the dashboard shows it)."""
    status = part.get("status", "live")
    if status == "leader unreachable":
        return "unreachable"
    if status == "not asked yet":
        return "?"
    if status == "no state":
        return "none"
    return str(part.get("highwater"))


def _last_append(p: dict[str, Any], now_ms: int) -> str:
    last = p.get("last_append_ms")
    if last is None:
        return "never"
    return _human_ms(max(0, now_ms - int(last))) + " ago" + ("" if p.get("writing") else "!")


def cmd_verify(args: argparse.Namespace) -> int:
    from pidlease.cli.verify import load_acked, verify_topic
    from pidlease.wire.tls import TLS_CA_FILE_ENV

    acked = load_acked(args.acked) if args.acked else None
    if args.tls_ca_file:  # verify_topic's readers take the CA from the environment
        os.environ[TLS_CA_FILE_ENV] = args.tls_ca_file
    report = verify_topic(args.coordinator, args.topic, acked=acked, api_token=args.api_token)
    print(report.summary())
    return 0 if report.ok else 1


def _run_moves(args: argparse.Namespace, path: str, what: str) -> int:
    """POST the plan (or the dry run), then poll the progress until the moves end."""
    import time

    with _client(args) as c:
        body = c.call("POST", path, {"dry_run": bool(args.dry_run)})
        moves = body.get("moves", [])
        if args.json and args.dry_run:
            print(json.dumps(body))
            return 0
        print(f"{what}: {len(moves)} move(s) planned over live servers {body.get('live')}")
        for m in moves:
            print(f"  {m['topic']}-{m['partition']}: {m['from']} -> {m['to']}")
        print(f"replicas per server after: {body.get('replicas_after')}")
        print(f"leaders per server after:  {body.get('leaders_after')}")
        if args.dry_run:
            print("dry run: nothing moved")
            return 0
        seen = 0
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            st = c.call("GET", "/v1/cluster/moves")
            # The job's node keeps its last lines only: count the dropped ones too.
            lines, dropped = st.get("lines", []), int(st.get("lines_dropped", 0))
            for line in lines[max(0, seen - dropped) :]:
                print(line, flush=True)
            seen = dropped + len(lines)
            if not st.get("running"):
                left = [m for m in st.get("moves", []) if m["state"] != "done"]
                if st.get("failure") or left:
                    print(f"error: {st.get('failure') or f'{len(left)} move(s) not done'}")
                    return 1
                return 0
            time.sleep(0.5)
    print(f"error: still running after {args.timeout} s (see GET /v1/cluster/moves)")
    return 1


def cmd_cluster_rebalance(args: argparse.Namespace) -> int:
    return _run_moves(args, "/v1/cluster/rebalance", "rebalance")


def cmd_server_drain(args: argparse.Namespace) -> int:
    return _run_moves(args, f"/v1/servers/{args.id}/drain", f"drain of server {args.id}")


def cmd_demo(args: argparse.Namespace) -> int:
    from pidlease.cli.demo import run_demo

    try:
        return run_demo(
            records=args.records,
            data_dir=args.data_dir,
            keep=args.keep,
            seed=args.seed,
            out=lambda s: print(s, flush=True),
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


# -- the parser ------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="pidlease",
        formatter_class=fmt,
        epilog=EPILOG,
        description="Exactly-once publishing with leased producer ids.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def coord(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--coordinator",
            metavar="URL",
            default=os.environ.get(ENV_COORDINATOR, DEFAULT_COORDINATOR),
            help="coordinator URL (env PIDLEASE_COORDINATOR, default %(default)s)",
        )
        p.add_argument(
            "--api-token",
            metavar="TOKEN",
            default=os.environ.get("PIDLEASE_API_TOKEN"),
            help="the coordinator's API token (env PIDLEASE_API_TOKEN)",
        )
        p.add_argument(
            "--tls-ca-file",
            metavar="PEM",
            default=os.environ.get("PIDLEASE_TLS_CA_FILE") or None,
            help="CA bundle to trust: TLS to the partition servers, and for an https:// "
            "coordinator (env PIDLEASE_TLS_CA_FILE; default plaintext / system store)",
        )

    def zk(p: argparse.ArgumentParser, help_text: str) -> None:
        p.add_argument("--zk", metavar="HOSTS", default=os.environ.get(ENV_ZK), help=help_text)

    dev = sub.add_parser(
        "dev",
        help="run a local cluster (ZooKeeper, coordinator, servers)",
        formatter_class=fmt,
        epilog="examples:\n  pidlease dev up --servers 3\n"
        "  pidlease dev up --detach --data-dir /tmp/pl && pidlease dev down --data-dir /tmp/pl",
    )
    dsub = dev.add_subparsers(dest="dev_command", metavar="up|down", required=True)
    up = dsub.add_parser("up", help="start a local cluster and print the coordinator URL")
    up.add_argument("--servers", type=int, default=1, help="partition servers (default 1)")
    up.add_argument(
        "--replication-factor",
        type=int,
        default=1,
        help="the cluster's default replication factor for new topics (checked against "
        "--servers; `topic create` without --replication-factor uses it)",
    )
    up.add_argument("--zk-nodes", type=int, choices=(1, 3), default=1, help="ZooKeeper nodes")
    up.add_argument(
        "--data-dir", default="pidlease-data", help="where everything lives (default ./%(default)s)"
    )
    up.add_argument("--port", type=int, default=8470, help="coordinator port (default %(default)s)")
    up.add_argument(
        "--zk",
        metavar="HOSTS",
        default=None,
        help="use this ZooKeeper (host:port/chroot) instead of starting one",
    )
    up.add_argument("--detach", action="store_true", help="leave it running in the background")
    up.set_defaults(func=cmd_dev_up)
    down = dsub.add_parser("down", help="stop the cluster started from --data-dir")
    down.add_argument("--data-dir", default="pidlease-data", help="the dir given to dev up")
    down.set_defaults(func=cmd_dev_down)

    c = sub.add_parser("coordinator", help="run the coordinator (settings from PIDLEASE_* env)")
    zk(c, "ZooKeeper hosts with chroot (env PIDLEASE_ZK)")
    c.add_argument("--port", type=int, help="HTTP port (env PIDLEASE_HTTP_PORT, default 8470)")
    c.set_defaults(func=cmd_coordinator)
    s = sub.add_parser(
        "partition-server", help="run one partition server (settings from PIDLEASE_* env)"
    )
    zk(s, "ZooKeeper hosts with chroot (env PIDLEASE_ZK)")
    s.add_argument("--port", type=int, help="TCP port (env PIDLEASE_PORT)")
    s.add_argument(
        "--kafka-port",
        type=int,
        help="Kafka listener and group coordinator port (env PIDLEASE_KAFKA_PORT, default "
        "9092; 0: none)",
    )
    s.add_argument("--server-id", type=int, help="server id (env PIDLEASE_SERVER_ID)")
    s.add_argument("--data-dir", help="log directory (env PIDLEASE_DATA_DIR)")
    s.set_defaults(func=cmd_partition_server)

    t = sub.add_parser("topic", help="create, alter, list, describe topics")
    tsub = t.add_subparsers(
        dest="topic_command", metavar="create|alter|list|describe", required=True
    )
    tc = tsub.add_parser(
        "create",
        help="create a topic",
        epilog="example: pidlease topic create orders --partitions 3 --dedup strict",
    )
    tc.add_argument("name")
    tc.add_argument("--partitions", type=int, default=1)
    tc.add_argument(
        "--replication-factor",
        type=int,
        default=None,
        help="copies of each partition (default: the cluster's, 1 unless the coordinator's "
        "topic_replication_factor_default or `dev up --replication-factor` says otherwise)",
    )
    tc.add_argument(
        "--dedup",
        choices=("strict", "monotonic", "off"),
        default="strict",
        help="strict: sequences must be contiguous; monotonic: increasing, holes allowed",
    )
    ta = tsub.add_parser(
        "alter",
        help="change a topic's retention, segment or min in-sync settings",
        epilog="example: pidlease topic alter orders --retention 1d --retention-bytes 10GiB\n"
        "durations: 500ms, 30s, 5m, 1h, 7d (or forever / never / -1); sizes: bytes or "
        "B, KiB, MiB, GiB, TiB, KB, MB, GB, TB (or unlimited / -1)",
        formatter_class=fmt,
    )
    ta.add_argument("name")
    for p in (tc, ta):
        for flag, field, parse, help_text in LOG_SETTING_FLAGS:
            metavar = "N" if parse is int else "SIZE" if "bytes" in field else "DURATION"
            p.add_argument(flag, dest=field, type=parse, metavar=metavar, help=help_text)
    tl = tsub.add_parser("list", help="list topics")
    td = tsub.add_parser("describe", help="partitions, leaders, offsets, settings of a topic")
    td.add_argument("name")
    td.add_argument(
        "--from",
        dest="first",
        type=int,
        default=0,
        metavar="N",
        help="first partition shown (default 0)",
    )
    td.add_argument(
        "--limit", type=int, default=1000, metavar="N", help="partitions shown (default 1000)"
    )
    td.add_argument(
        "--no-offsets",
        action="store_true",
        help="ZooKeeper only: leaders and in-sync sets, no partition server asked",
    )
    for p, f in (
        (tc, cmd_topic_create),
        (ta, cmd_topic_alter),
        (tl, cmd_topic_list),
        (td, cmd_topic_describe),
    ):
        coord(p)
        p.add_argument("--json", action="store_true", help="print JSON")
        p.set_defaults(func=f)

    pr = sub.add_parser(
        "produce",
        help="send stdin lines as records, exactly once",
        formatter_class=fmt,
        epilog="examples:\n  seq 1 100 | pidlease produce orders\n"
        "  printf 'k1=v1\\nk2=v2\\n' | pidlease produce orders --key-separator =",
    )
    pr.add_argument("topic")
    coord(pr)
    pr.add_argument("--key-separator", metavar="SEP", help="split each line into KEY SEP VALUE")
    pr.add_argument(
        "--producer-name", help="a stable name: a rerun takes the PID over (fencing the old one)"
    )
    pr.add_argument("--partition", type=int, help="send everything to this partition")
    pr.add_argument("--linger-ms", type=float, default=5)
    pr.add_argument("--max-in-flight", type=int, default=5)
    pr.add_argument("--keep-newlines", action="store_true", help="do not strip line endings")
    pr.set_defaults(func=cmd_produce)

    co = sub.add_parser(
        "consume",
        help="print a partition's records",
        epilog="example: pidlease consume orders --partition 0 --from 0 --max 10 --json",
    )
    co.add_argument("topic")
    coord(co)
    co.add_argument("--partition", type=int, default=0)
    start = co.add_mutually_exclusive_group()
    start.add_argument(
        "--from",
        dest="from_offset",
        type=parse_start,
        default=0,
        metavar="OFFSET|earliest|latest",
        help="the first offset, or the log start (earliest) or end (latest); default 0",
    )
    start.add_argument(
        "--from-time",
        type=parse_time_ms,
        metavar="TIME",
        help="from the first batch written at or after TIME: ms since the epoch or ISO 8601",
    )
    co.add_argument("--max", type=int, help="stop after this many records")
    co.add_argument("--follow", action="store_true", help="keep waiting for new records")
    co.add_argument("--include-control", action="store_true", help="show fence records too")
    co.add_argument("--json", action="store_true", help="one JSON object per record, all fields")
    co.add_argument(
        "--group",
        help="read the partitions this consumer group assigns, from its commits, and commit",
    )
    co.set_defaults(func=cmd_consume)

    gr = sub.add_parser("groups", help="list, describe, delete consumer groups (Kafka's too)")
    gsub = gr.add_subparsers(dest="groups_command", required=True)
    gl = gsub.add_parser("list", help="every consumer group and its state")
    gd = gsub.add_parser("describe", help="a group's members, partitions, offsets and lag")
    gd.add_argument("group")
    gx = gsub.add_parser("delete", help="delete an empty group and its committed offsets")
    gx.add_argument("group")
    for g, f in ((gl, cmd_groups_list), (gd, cmd_groups_describe), (gx, cmd_groups_delete)):
        coord(g)
        g.add_argument("--json", action="store_true", help="machine-readable output")
        g.set_defaults(func=f)

    pi = sub.add_parser(
        "pids", help="the PID expiry table", epilog="example: pidlease pids --expiring-within 5m"
    )
    coord(pi)
    pi.add_argument(
        "--expiring-within",
        type=parse_duration_ms,
        metavar="DURATION",
        help="only running leases that expire within e.g. 30s, 5m, 1h",
    )
    pi.add_argument("--state", choices=("active", "expiring", "lapsed"), help="only this state")
    pi.add_argument(
        "--not-writing",
        action="store_true",
        help="only leases still running whose highwaters did not move within --idle",
    )
    pi.add_argument("--idle", type=parse_duration_ms, default=60_000, metavar="DURATION")
    pi.add_argument("--filter", default="", help="text in the name, pid or partitions")
    pi.add_argument("--limit", type=int, default=1000)
    pi.add_argument("--json", action="store_true")
    pi.set_defaults(func=cmd_pids)

    v = sub.add_parser(
        "verify",
        help="exactly-once audit of a topic (exit 1 on any violation)",
        epilog="example: pidlease verify orders --acked acked.jsonl",
    )
    v.add_argument("topic")
    coord(v)
    v.add_argument(
        "--acked",
        metavar="FILE",
        help='JSON lines {"partition": P, "pid": X, "sequence_id": S} that must be present',
    )
    v.set_defaults(func=cmd_verify)

    from pidlease.cli import mirror as mirror_cli

    mirror_cli.add_parser(sub)

    cl = sub.add_parser("cluster", help="rebalance replicas and leaders over the live servers")
    clsub = cl.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)
    cr = clsub.add_parser(
        "rebalance",
        help="move replicas and leaderships so every live server holds an even share",
    )
    sv = sub.add_parser("server", help="drain a partition server before removing it")
    svsub = sv.add_subparsers(dest="server_command", metavar="ACTION", required=True)
    sd = svsub.add_parser("drain", help="move every replica off server ID")
    sd.add_argument("id", type=int, metavar="ID")
    for p, f in ((cr, cmd_cluster_rebalance), (sd, cmd_server_drain)):
        coord(p)
        p.add_argument("--dry-run", action="store_true", help="print the plan, move nothing")
        p.add_argument("--json", action="store_true", help="with --dry-run: print the plan as JSON")
        p.add_argument(
            "--timeout", type=float, default=3600.0, help="seconds to wait for the moves"
        )
        p.set_defaults(func=f)

    d = sub.add_parser("demo", help="exactly-once under dropped connections and SIGKILLed servers")
    d.add_argument("--records", type=int, default=200_000)
    d.add_argument("--data-dir", help="a fresh dir (default: a new temporary dir)")
    d.add_argument("--keep", action="store_true", help="keep the data dir afterwards")
    d.add_argument("--seed", type=int, help="replay a fault schedule")
    d.set_defaults(func=cmd_demo)
    return parser


_HINTS: dict[type, str] = {
    errors.CoordinatorUnavailable: "is the coordinator running at {url}? start a local cluster "
    "with `pidlease dev up`, or pass --coordinator URL / set "
    "PIDLEASE_COORDINATOR",
    errors.UnknownTopicOrPartition: "list topics with `pidlease topic list`; create one with "
    "`pidlease topic create NAME --partitions N`",
    errors.TopicExists: "see it with `pidlease topic describe NAME`",
    errors.ProducerFenced: "another producer took this producer name over; the newest one wins",
    errors.Unauthorized: "set PIDLEASE_API_TOKEN (or --api-token) to the coordinator's API token",
    errors.Forbidden: "this token's principal lacks the scope or does not own the PID; "
    "see the detail",
    errors.OffsetOutOfRange: "the records are gone from the source; to go on without them, "
    "restart with a new --name (and an empty target topic) or from the log start",
    errors.PidLimitExceeded: "reuse a producer name (--producer-name takes its PID over) instead "
    "of leasing new PIDs, or ask an operator to raise pids_max_per_principal",
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except errors.PidleaseError as exc:
        print(f"error: {exc.name}: {exc.detail}", file=sys.stderr)
        for cls, hint in _HINTS.items():
            if isinstance(exc, cls):
                print(
                    # `mirror` has two coordinators: the error names the one it could not reach
                    f"hint: {hint.format(url=getattr(args, 'coordinator', 'the URL above'))}",
                    file=sys.stderr,
                )
                break
        return 1
    except Exception as exc:
        from pidlease.cli.devctl import DevError

        if isinstance(exc, DevError):
            print(f"error: {exc}", file=sys.stderr)
            return 1
        raise
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
