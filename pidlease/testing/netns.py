"""Hosts made of Linux network namespaces, for tests that cut real links.

A :class:`Network` is one namespace per host plus a bridge in a namespace of its own;
each host has a veth into the bridge and an address from a /24 that exists only inside
these namespaces, with no default route, so nothing a test starts can reach (or be
reached from) the machine's own network. Links are cut with nft drop rules in a
``table bridge`` forward chain in the bridge's namespace (both ends see silence, not
resets, as with a real partition), a host is isolated by setting its veth down, and
:meth:`Network.queue` sends one host's traffic through an NFQUEUE so a user-space
program can delay and drop it (the kernel here has no ``netem``).

Names are unique per run (``pln<pid>-<host>``) and everything is removed by name and PID
in :meth:`Network.close`, which an ``atexit`` hook also calls; namespaces left by a run
whose process is gone are removed by the next one (:func:`remove_stale`).

Needs root and ``ip``/``nft``; :func:`unavailable` says why not where they are missing.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

CLONE_NEWNET = 0x40000000
PREFIX = "pln"
NETNS_DIR = Path("/var/run/netns")
TABLE = "nemesis"
CHAIN = "cuts"
_STALE_NAME = re.compile(rf"^{PREFIX}(\d+)-")


class NetnsError(RuntimeError):
    pass


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None when they can): a reason for a skip."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"no `{tool}` command (Debian: iproute2, nftables)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    r = _run(["ip", "netns", "add", probe], check=False)
    if r.returncode != 0:
        return f"`ip netns add` failed: {r.stderr.strip()}"
    _run(["ip", "netns", "del", probe], check=False)
    return None


def _run(
    argv: list[str], *, check: bool = True, timeout_s: float = 30.0
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    if check and r.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
    return r


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def netns_pids(ns: str) -> list[int]:
    r = _run(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in r.stdout.split()] if r.returncode == 0 else []


def _delete_namespace(ns: str) -> None:
    """SIGKILL whatever still runs in ``ns`` (by PID), then delete it."""
    for pid in netns_pids(ns):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _run(["ip", "netns", "del", ns], check=False)


def remove_stale() -> list[str]:
    """Delete namespaces of earlier runs whose process is gone (a run killed -9 cannot
    clean up after itself). Returns their names."""
    gone: list[str] = []
    if not NETNS_DIR.is_dir():
        return gone
    for entry in sorted(NETNS_DIR.iterdir()):
        m = _STALE_NAME.match(entry.name)
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            _delete_namespace(entry.name)
            gone.append(entry.name)
    return gone


@dataclass
class Host:
    name: str  # the test's name for it: "zk", "s1", "client"
    ns: str  # its namespace
    port: str  # its veth's end in the bridge's namespace
    address: str  # its only address


@dataclass
class Network:
    """Hosts on one bridge. ``Network(["zk", "s1", "client"]).start()``; ``close()``."""

    names: list[str]
    subnet: str = "10.77.0"  # a /24 that exists only inside these namespaces
    tag: str = field(default_factory=lambda: str(os.getpid()))
    hosts: dict[str, Host] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _closed: bool = False

    @property
    def bridge_ns(self) -> str:
        return f"{PREFIX}{self.tag}-br"

    def start(self) -> Network:
        if len(self.names) > 250:
            raise ValueError("at most 250 hosts on a /24")
        remove_stale()
        atexit.register(self.close)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        br = self.bridge_ns
        _run(["ip", "netns", "add", br])
        _run(["ip", "-n", br, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", br, "link", "set", "br0", "up"])
        for i, name in enumerate(self.names):
            host = Host(name, f"{PREFIX}{self.tag}-{name}", f"v{self.tag}{name}"[:15], "")
            host.address = f"{self.subnet}.{i + 2}"
            self.hosts[name] = host
            _run(["ip", "netns", "add", host.ns])
            # The veth is made in the host's namespace; its other end moves to the bridge's.
            _run(["ip", "-n", host.ns, "link", "add", "eth0", "type", "veth", "peer", host.port])
            _run(["ip", "-n", host.ns, "link", "set", host.port, "netns", br])
            _run(["ip", "-n", br, "link", "set", host.port, "master", "br0", "up"])
            _run(["ip", "-n", host.ns, "addr", "add", f"{host.address}/24", "dev", "eth0"])
            _run(["ip", "-n", host.ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", host.ns, "link", "set", "lo", "up"])
        self.nft(
            f"add table bridge {TABLE}\n"
            f"add chain bridge {TABLE} {CHAIN} "
            "{ type filter hook forward priority 0; policy accept; }\n"
        )

    # -- processes -------------------------------------------------------------------------
    def argv(self, host: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.hosts[host].ns, *argv]

    def popen(
        self, host: str, argv: list[str], *, env: dict[str, str], log: IO[bytes]
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` in ``host`` (``ip netns exec`` execs it: the PID is the program's)."""
        proc = subprocess.Popen(
            self.argv(host, argv),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    @contextlib.contextmanager
    def entered(self, host: str) -> Iterator[None]:
        """Run the calling thread in ``host``'s namespace (threads it starts stay there)."""
        libc = ctypes.CDLL(None, use_errno=True)
        with open("/proc/thread-self/ns/net", "rb") as home:
            with open(NETNS_DIR / self.hosts[host].ns, "rb") as there:
                if libc.setns(there.fileno(), CLONE_NEWNET) != 0:
                    raise NetnsError(f"setns {host}: {os.strerror(ctypes.get_errno())}")
            try:
                yield
            finally:
                libc.setns(home.fileno(), CLONE_NEWNET)

    # -- nemeses ---------------------------------------------------------------------------
    def nft(self, script: str) -> None:
        r = subprocess.run(
            ["ip", "netns", "exec", self.bridge_ns, "nft", "-f", "-"],
            input=script,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if r.returncode != 0:
            raise NetnsError(f"nft: {r.stderr.strip()}\n{script}")

    def cut(self, a: str, b: str, *, one_way: bool = False) -> None:
        """Drop frames from ``a`` to ``b`` (and back unless ``one_way``)."""
        pa, pb = self.hosts[a].port, self.hosts[b].port
        rules = [f"add rule bridge {TABLE} {CHAIN} iifname {pa} oifname {pb} drop\n"]
        if not one_way:
            rules.append(f"add rule bridge {TABLE} {CHAIN} iifname {pb} oifname {pa} drop\n")
        self.nft("".join(rules))

    def split(self, side_a: list[str], side_b: list[str]) -> None:
        for a in side_a:
            for b in side_b:
                self.cut(a, b)

    def link(self, host: str, up: bool) -> None:
        """Set ``host``'s veth (its end in the bridge) down: the host hears nothing."""
        state = "up" if up else "down"
        _run(["ip", "-n", self.bridge_ns, "link", "set", self.hosts[host].port, state])

    def queue(self, host: str, queue_num: int) -> None:
        """Send ``host``'s packets (out and in) through NFQUEUE ``queue_num`` in its own
        namespace; with ``--queue-bypass`` they pass untouched while no program listens.
        iptables, not nft: this kernel has the xt NFQUEUE target but no nft ``queue``."""
        for chain, flag in (("OUTPUT", "-o"), ("INPUT", "-i")):
            _run(
                self.argv(
                    host,
                    [
                        *("iptables", "-I", chain, flag, "eth0", "-j", "NFQUEUE"),
                        *("--queue-num", str(queue_num), "--queue-bypass"),
                    ],
                )
            )

    def unqueue(self, host: str) -> None:
        for chain in ("OUTPUT", "INPUT"):  # only this run's rules live in the host's tables
            _run(self.argv(host, ["iptables", "-F", chain]), check=False)

    def heal(self) -> None:
        """Remove every cut, bring every link up and every queue down."""
        self.nft(f"flush chain bridge {TABLE} {CHAIN}\n")
        for name in self.hosts:
            self.link(name, up=True)
            self.unqueue(name)

    # -- cleanup ---------------------------------------------------------------------------
    def close(self) -> None:
        """Kill every process started here (by PID), then every namespace of this run with
        whatever still runs in it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
        for host in self.hosts.values():
            _delete_namespace(host.ns)
        _delete_namespace(self.bridge_ns)
        with contextlib.suppress(ValueError):
            atexit.unregister(self.close)

    def leftovers(self) -> list[str]:
        """Namespaces of this run that still exist (empty after ``close``)."""
        ours = {h.ns for h in self.hosts.values()} | {self.bridge_ns}
        return (
            sorted(e.name for e in NETNS_DIR.iterdir() if e.name in ours)
            if NETNS_DIR.is_dir()
            else []
        )
