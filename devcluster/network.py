"""The pods' network: pod sandboxes, a Service proxy and the cluster DNS (kube-apiserver gives
Services their ClusterIPs).

What each part stands for (and where it is simpler):

- **Pod sandbox** (a container runtime's pod sandbox with a CNI bridge plugin): where the
  machine allows it (root, util-linux `unshare`/`nsenter`, iproute2 `ip`) and the topology asks
  for `network: namespaces`, each pod gets a network namespace of its own with `eth0` (a veth)
  on a bridge, an address of the bridge's subnet, `lo`, and a default route via the bridge.
  A server binding `0.0.0.0:8888` then takes the port in its own pod only. Otherwise pods share
  the host's network, each on an own loopback address (127.0.x.y), with `0.0.0.0` rewritten.
- **resolv.conf and hosts** (the kubelet's: pkg/kubelet/network/dns/dns.go, ClusterFirst with
  `ndots:5` and the `<ns>.svc.<domain> svc.<domain> <domain>` search path;
  pkg/kubelet/kubelet_pods.go managedHostsFileContent): bind-mounted over /etc/resolv.conf and
  /etc/hosts in a mount namespace of the pod's own, with its hostname in a UTS namespace.
- **Service proxy** (kube-proxy's former userspace mode, removed in 1.26 but the same
  contract): a TCP listener on each ClusterIP:port forwards a connection to a ready pod the
  selector matches, at its targetPort (number or container port name). With no ready endpoint
  the connection is reset (kube-proxy's iptables mode rejects it: connection refused).
- **Cluster DNS** (CoreDNS's kubernetes plugin, https://github.com/kubernetes/dns/blob/master/
  docs/specification.md): A records for `<svc>.<ns>.svc.<domain>` (the ClusterIP; a headless
  Service's ready pods), `<a-b-c-d>.<ns>.pod.<domain>`; NXDOMAIN for the rest of the cluster
  domain and, with no upstream here, for every other name. UDP only.

Not modelled: NetworkPolicy, NodePort/LoadBalancer exposure, UDP Services, EndpointSlice objects,
hostname/subdomain records, IPv6.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import os
import random
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import dns.flags
import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

from devcluster.subnetclaim import claim_subnet

log = logging.getLogger("devcluster")

DOMAIN = "cluster.local"
UNSHARE = shutil.which("unshare")
NSENTER = shutil.which("nsenter")
HOSTNAME = shutil.which("hostname")
IP = shutil.which("ip")
#: where the devcluster notes the bridges it made, so a later run removes those of a dead one
RUN_DIR = Path("/run/devcluster")

#: every (namespace, pod) list the proxy and the DNS read: the store's current pods
Pods = Callable[[str], Iterable[Mapping[str, Any]]]


# ------------------------------------------------------------------ what the machine allows
@functools.cache
def sandboxes() -> bool:
    """Whether pods can get mount and UTS namespaces of their own (tried once)."""
    if not (UNSHARE and HOSTNAME and NSENTER) or os.geteuid() != 0:
        return False
    try:
        done = subprocess.run(
            [UNSHARE, "--mount", "--uts", "--", "true"], capture_output=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@functools.cache
def network_namespaces() -> bool:
    """Whether pods can get network namespaces on a bridge (tried once)."""
    if not (sandboxes() and IP):
        return False
    try:
        done = subprocess.run([UNSHARE, "--net", "--", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


# ------------------------------------------------------------------ kubelet's files
def resolv_conf(namespace: str, nameserver: str) -> str:
    """The kubelet's resolv.conf for a ClusterFirst pod."""
    search = f"{namespace}.svc.{DOMAIN} svc.{DOMAIN} {DOMAIN}"
    return f"search {search}\nnameserver {nameserver}\noptions ndots:5\n"


def hosts_file(ip: str, hostname: str) -> str:
    """The kubelet's managed /etc/hosts (managedHostsFileContent)."""
    return (
        "# Kubernetes-managed hosts file.\n"
        "127.0.0.1\tlocalhost\n"
        "::1\tlocalhost ip6-localhost ip6-loopback\n"
        "fe00::0\tip6-localnet\n"
        "fe00::0\tip6-mcastprefix\n"
        "fe00::1\tip6-allnodes\n"
        "fe00::2\tip6-allrouters\n"
        f"{ip}\t{hostname}\n"
    )


# "$0" hostname, "$1" resolv.conf, "$2" hosts; then the command (sh execs it: its pid stays).
# A machine without one of the files keeps it so (a bind mount needs a file to cover).
_SANDBOX = (
    'hostname "$0" && { [ ! -e /etc/resolv.conf ] || mount --bind "$1" /etc/resolv.conf; } '
    '&& { [ ! -e /etc/hosts ] || mount --bind "$2" /etc/hosts; } && shift 2 && exec "$@"'
)


def with_resolver(command: list[str], resolv: Path) -> list[str]:
    """`command` seeing the cluster's resolv.conf (a private mount namespace), for a process
    outside the cluster that must resolve Service names as a pod does (the hub in a test: in
    z2jh the hub is a pod); unchanged where the machine has no mount namespaces."""
    if not sandboxes():
        return command
    script = 'mount --bind "$0" /etc/resolv.conf && exec "$@"'
    return [UNSHARE or "unshare", "--mount", "--", "sh", "-c", script, str(resolv), *command]


# ------------------------------------------------------------------ addresses
class LoopbackPool:
    """127.0.0.2 ... 127.0.254.254, one per running pod, DNS server or ClusterIP.

    Several devclusters may share a machine (a demo beside a test run, parallel test runs), and
    they cannot see each other's pods: each starts at a random address, and an address where a
    container port is already taken is skipped, so a pod never answers on another's socket.
    """

    def __init__(self, seed: int | None = None) -> None:
        self.used: set[str] = set()
        self.next = random.Random(seed).randrange(2, 254 * 256)

    def take(self, ports: Iterable[int] = ()) -> str:
        ports = list(ports)
        for _ in range(256 * 254):
            n = self.next
            self.next = self.next + 1 if self.next < 254 * 256 else 2
            ip = f"127.0.{n // 256}.{n % 256}"
            if n % 256 in (0, 255) or ip in self.used or not ports_free(ip, ports):
                continue
            self.used.add(ip)
            return ip
        raise RuntimeError("no free loopback address")

    def give(self, ip: str) -> None:
        self.used.discard(ip)


class SubnetPool:
    """Addresses of one range (pods on the bridge, or ClusterIPs), lowest free first."""

    def __init__(self, network: ipaddress.IPv4Network, skip: Iterable[str] = ()) -> None:
        self.network = network
        self.used: set[str] = set(skip)

    def take(self, ports: Iterable[int] = ()) -> str:
        for host in self.network.hosts():
            if str(host) not in self.used:
                self.used.add(str(host))
                return str(host)
        raise RuntimeError(f"no free address in {self.network}")

    def give(self, ip: str) -> None:
        self.used.discard(ip)


def ports_free(ip: str, ports: Iterable[int]) -> bool:
    """Whether nothing listens on `ip` at any of `ports` (a test bind, like the process's own)."""
    for port in ports:
        with socket.socket() as s:
            try:
                s.bind((ip, port))
            except OSError:
                return False
    return True


# ------------------------------------------------------------------ the network
class Network:
    """Pods on the host's network, each on an own loopback address; ClusterIPs and the DNS
    server on loopback addresses too. `start()` before use, `stop()` at the end."""

    mode = "host"

    def __init__(self, state_dir: Path, pods: Pods) -> None:
        self.state_dir = state_dir
        self.pods = pods
        self.ips: Any = LoopbackPool()
        self.service_ips: Any = self.ips
        self.dns_ip = ""
        #: where a pod reaches the host's own servers (the apiserver, a hub outside the cluster)
        self.host_ip = "127.0.0.1"
        self._dns: asyncio.DatagramTransport | None = None
        self._services: dict[tuple[str, str], dict[str, Any]] = {}
        self.proxy = ServiceProxy(pods, lambda key: self._services.get(key, {}).get("spec") or {})
        self._service_lock = asyncio.Lock()  # a delete right after a create: in order

    @property
    def resolv_path(self) -> Path:
        """The resolv.conf for processes outside the cluster that resolve as its pods do."""
        return self.state_dir / "network" / "resolv.conf"

    async def start(self) -> None:
        if not sandboxes():  # no mount namespaces: no pod could use the DNS server
            return
        self.dns_ip = self.dns_ip or self.ips.take([53])  # the bridge's gateway, else its own
        loop = asyncio.get_running_loop()
        try:
            self._dns, _ = await loop.create_datagram_endpoint(
                lambda: DnsServer(self.lookup), local_addr=(self.dns_ip, 53)
            )
        except OSError as exc:
            log.warning("devcluster: no cluster DNS on %s:53: %s", self.dns_ip, exc)
            self.dns_ip = ""
            return
        self.resolv_path.parent.mkdir(parents=True, exist_ok=True)
        self.resolv_path.write_text(resolv_conf("default", self.dns_ip))
        # where pods reach a server on the host (a test's hub binds it with `network: namespaces`)
        (self.resolv_path.parent / "host-ip").write_text(self.host_ip + "\n")

    async def stop(self) -> None:
        if self._dns is not None:
            self._dns.close()
        await self.proxy.close()

    # ---------------------------------------------------------------- pods
    async def sandbox(self, namespace: str, name: str, ip: str) -> list[str]:
        """The argv prefix that runs a pod's command in its sandbox; the files it needs are
        written under the pod's directory."""
        if not sandboxes():
            return []
        etc = self.state_dir / "pods" / namespace / name / "etc"
        etc.mkdir(parents=True, exist_ok=True)
        hostname = pod_hostname(name)
        (etc / "hosts").write_text(hosts_file(ip, hostname))
        # no DNS server (port 53 taken): the host's resolver, as before
        resolv = resolv_conf(namespace, self.dns_ip) if self.dns_ip else _host_resolv()
        (etc / "resolv.conf").write_text(resolv)
        argv = [UNSHARE or "unshare", "--mount", "--uts", "--", "sh", "-c", _SANDBOX, hostname]
        return [*argv, str(etc / "resolv.conf"), str(etc / "hosts")]

    async def release(self, ip: str) -> None:
        self.ips.give(ip)

    def rewrites_any_address(self) -> bool:
        """Whether `0.0.0.0` in a pod's env and args is rewritten to its address (host network)."""
        return self.mode == "host"

    # ---------------------------------------------------------------- services
    async def on_service(self, kind: str, service: Mapping[str, Any]) -> None:
        """The store's change of a Service: its proxy and DNS name follow."""
        async with self._service_lock:
            await self._on_service(kind, service)

    async def _on_service(self, kind: str, service: Mapping[str, Any]) -> None:
        meta = service["metadata"]
        key = (meta["namespace"], meta["name"])
        ip = (service.get("spec") or {}).get("clusterIP") or ""
        if kind == "DELETED":
            self._services.pop(key, None)
            await self.proxy.remove(key)
            if ip and ip != "None":
                await self._give_service_ip(ip)
            return
        self._services[key] = dict(service)
        if ip and ip != "None":
            await self._bind_service_ip(ip)
            await self.proxy.sync(key, service)

    async def _bind_service_ip(self, ip: str) -> None:
        """Where a ClusterIP must exist as an address before the proxy can listen on it."""

    async def _give_service_ip(self, ip: str) -> None:
        self.service_ips.give(ip)

    def lookup(self, name: str) -> list[str] | None:
        """A records for `name` (lower case, no trailing dot); None: no such name."""
        suffix = f".{DOMAIN}"
        if not name.endswith(suffix):
            return None
        labels = name[: -len(suffix)].split(".")
        if len(labels) == 3 and labels[2] == "svc":
            service = self._services.get((labels[1], labels[0]))
            if service is None:
                return None
            spec = service.get("spec") or {}
            if spec.get("clusterIP") and spec["clusterIP"] != "None":
                return [spec["clusterIP"]]
            return [p["status"]["podIP"] for p in ready_pods(self.pods(labels[1]), spec)]
        if len(labels) == 2 and labels[1] == "svc":
            return [] if any(ns == labels[0] for ns, _ in self._services) else None
        if len(labels) == 3 and labels[2] == "pod":
            try:
                return [str(ipaddress.IPv4Address(labels[0].replace("-", ".")))]
            except ValueError:
                return None
        return None


class NamespaceNetwork(Network):
    """Each pod in a network namespace of its own on a bridge: `<bridge>` holds the gateway
    (the first address of a random 10.x.0.0/16) and the ClusterIPs (its upper half, as /32
    addresses, so the userspace proxy can listen on them); pods get addresses of the lower half.
    The DNS server answers on the gateway."""

    mode = "namespaces"

    def __init__(self, state_dir: Path, pods: Pods) -> None:
        super().__init__(state_dir, pods)
        self.bridge = f"dc{random.randrange(16**6):06x}"
        # held until stop() has deleted the bridge: another devcluster choosing meanwhile
        # (before this bridge has its address) skips it
        self._subnet = claim_subnet(RUN_DIR / "subnets", _interface_networks)
        self.subnet = self._subnet.network
        pods_half, services_half = self.subnet.subnets(1)
        self.gateway = str(next(pods_half.hosts()))
        self.ips = SubnetPool(pods_half, skip=[self.gateway])
        self.service_ips = SubnetPool(services_half)
        self.dns_ip = self.gateway
        self.host_ip = self.gateway
        self._netns: dict[str, str] = {}  # pod ip -> netns name

    async def start(self) -> None:
        _sweep_dead_bridges()
        prefix = self.subnet.prefixlen
        await _ip("link", "add", self.bridge, "type", "bridge")
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        # written whole then renamed: another devcluster's sweep that read it half-written
        # ("" is no pid) took this live bridge for a dead one's and deleted it
        note = RUN_DIR / f".{self.bridge}.{os.getpid()}"
        note.write_text(f"{os.getpid()}\n")
        note.replace(RUN_DIR / self.bridge)
        await _ip("addr", "add", f"{self.gateway}/{prefix}", "dev", self.bridge)
        await _ip("link", "set", self.bridge, "up")
        await super().start()

    async def stop(self) -> None:
        await super().stop()
        for ip in list(self._netns):
            await self.release(ip)
        await _ip("link", "del", self.bridge, check=False)
        (RUN_DIR / self.bridge).unlink(missing_ok=True)
        self._subnet.release()

    async def sandbox(self, namespace: str, name: str, ip: str) -> list[str]:
        netns = self._netns.get(ip)
        if netns is None:
            netns = f"{self.bridge}-{ip.split('.', 2)[2].replace('.', '-')}"
            veth = f"v{self.bridge[2:]}{int(ipaddress.IPv4Address(ip)) & 0x7FFF:04x}"
            await _ip("netns", "add", netns)
            self._netns[ip] = netns
            await _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
            await _ip("link", "set", veth, "master", self.bridge, "up")
            inside = (
                f"addr add {ip}/{self.subnet.prefixlen} dev eth0\n"
                "link set eth0 up\nlink set lo up\n"
                f"route add default via {self.gateway}\n"
            )
            await _ip("-n", netns, "-batch", "-", stdin=inside)
        argv = await super().sandbox(namespace, name, ip)
        return [NSENTER or "nsenter", f"--net=/run/netns/{netns}", "--", *argv]

    async def release(self, ip: str) -> None:
        netns = self._netns.pop(ip, None)
        if netns is not None:  # the veth pair goes with the namespace
            await _ip("netns", "del", netns, check=False)
        await super().release(ip)

    async def _bind_service_ip(self, ip: str) -> None:
        await _ip("addr", "replace", f"{ip}/32", "dev", self.bridge, check=False)

    async def _give_service_ip(self, ip: str) -> None:
        await _ip("addr", "del", f"{ip}/32", "dev", self.bridge, check=False)
        await super()._give_service_ip(ip)


def make_network(mode: str, state_dir: Path, pods: Pods) -> Network:
    """`namespaces` where asked for and allowed (said otherwise), else the host's network."""
    if mode == "namespaces":
        if network_namespaces():
            return NamespaceNetwork(state_dir, pods)
        log.warning(
            "devcluster: `network: namespaces` needs root, util-linux unshare/nsenter and "
            "iproute2: pods share the host's network"
        )
    elif mode != "host":
        raise ValueError(f"network: {mode!r} is not one of 'host', 'namespaces'")
    return Network(state_dir, pods)


def pod_hostname(name: str) -> str:
    """The pod's hostname: its name cut to 63 characters (kubelet GeneratePodHostNameAndDomain
    truncates a longer one, trailing '-'/'.' dropped)."""
    return name[:63].rstrip("-.")


def _host_resolv() -> str:
    try:
        return Path("/etc/resolv.conf").read_text()
    except OSError:
        return ""


def _interface_networks() -> list[ipaddress.IPv4Network]:
    """The IPv4 networks of this machine's interfaces (other devclusters' bridges included)."""
    done = subprocess.run([IP or "ip", "-4", "-o", "addr"], capture_output=True, text=True)
    return [ipaddress.ip_interface(w).network for w in done.stdout.split() if "/" in w]


def _sweep_dead_bridges() -> None:
    """Remove the bridges (and pod namespaces) of devclusters that died without stopping."""
    if not RUN_DIR.is_dir():
        return
    for note in RUN_DIR.iterdir():
        # only bridges' notes: not one being written (".dc...", NamespaceNetwork.start), nor
        # the subnets' lock files (subnets/, devcluster/subnetclaim.py)
        if not note.name.startswith("dc"):
            continue
        try:
            os.kill(int(note.read_text().strip()), 0)
            continue  # its devcluster runs
        except (ValueError, ProcessLookupError):
            pass
        except (PermissionError, FileNotFoundError):  # another's, or stopped meanwhile
            continue
        subprocess.run([IP or "ip", "link", "del", note.name], capture_output=True)
        for ns in Path("/run/netns").glob(f"{note.name}-*"):
            subprocess.run([IP or "ip", "netns", "del", ns.name], capture_output=True)
        note.unlink(missing_ok=True)


async def _ip(*args: str, check: bool = True, stdin: str | None = None) -> None:
    process = await asyncio.create_subprocess_exec(
        IP or "ip",
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await process.communicate(stdin.encode() if stdin is not None else None)
    if check and process.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {err.decode(errors='replace').strip()}")


# ------------------------------------------------------------------ endpoints
def _ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if pod.get("metadata", {}).get("deletionTimestamp") or not status.get("podIP"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def ready_pods(
    pods: Iterable[Mapping[str, Any]], spec: Mapping[str, Any]
) -> Iterator[Mapping[str, Any]]:
    """The Service's ready endpoints (the EndpointSlice controller: a selector matches pod
    labels; a Service without a selector has none here)."""
    selector = spec.get("selector") or {}
    if not selector:
        return
    for pod in pods:
        labels = pod.get("metadata", {}).get("labels") or {}
        if all(labels.get(k) == v for k, v in selector.items()) and _ready(pod):
            yield pod


def target_port(pod: Mapping[str, Any], port: Mapping[str, Any]) -> int | None:
    """The port a Service port sends to in `pod`: a number, or a container port's name."""
    target = port.get("targetPort", port.get("port"))
    if isinstance(target, int) or (isinstance(target, str) and target.isdigit()):
        return int(target)
    for container in (pod.get("spec") or {}).get("containers") or []:
        for p in container.get("ports") or []:
            if p.get("name") == target:
                return int(p["containerPort"])
    return None


# ------------------------------------------------------------------ the Service proxy
class ServiceProxy:
    """A TCP listener per ClusterIP:port that forwards each connection to a ready endpoint."""

    def __init__(self, pods: Pods, spec_of: Callable[[tuple[str, str]], Mapping[str, Any]]) -> None:
        self.pods = pods
        self.spec_of = spec_of  # a Service's current spec (the network's record), {} if gone
        self.listeners: dict[tuple[str, str], list[asyncio.AbstractServer]] = {}
        self._bound: dict[tuple[str, str], list[tuple[str, int]]] = {}

    async def sync(self, key: tuple[str, str], service: Mapping[str, Any]) -> None:
        spec = service.get("spec") or {}
        wanted = [
            (spec["clusterIP"], int(p["port"]))
            for p in spec.get("ports") or []
            if p.get("protocol", "TCP") == "TCP"
        ]
        if self._bound.get(key) == wanted:
            return
        await self.remove(key)
        servers = []
        for ip, port in wanted:
            try:
                servers.append(
                    await asyncio.start_server(
                        functools.partial(self._forward, key, port), ip, port, reuse_address=True
                    )
                )
            except OSError as exc:
                log.warning("devcluster: Service %s/%s: no proxy on %s:%s: %s", *key, ip, port, exc)
        self.listeners[key] = servers
        self._bound[key] = wanted

    async def remove(self, key: tuple[str, str]) -> None:
        for server in self.listeners.pop(key, []):
            server.close()
        self._bound.pop(key, None)

    async def close(self) -> None:
        for key in list(self.listeners):
            await self.remove(key)

    async def _forward(
        self,
        key: tuple[str, str],
        port: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        spec = self.spec_of(key)
        service_port = next((p for p in spec.get("ports") or [] if int(p["port"]) == port), {})
        choices = [
            (p["status"]["podIP"], t)
            for p in ready_pods(self.pods(key[0]), spec)
            if (t := target_port(p, service_port)) is not None
        ]
        if not choices:
            _reset(writer)
            return
        ip, target = random.choice(choices)
        try:
            up_reader, up_writer = await asyncio.open_connection(ip, target)
        except OSError:
            _reset(writer)
            return
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            up_writer.close()
            writer.close()


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:  # SO_LINGER 0: the close sends RST, the client sees a refusal
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One direction; its end half-closes the other side (HTTP clients wait for it)."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


# ------------------------------------------------------------------ the DNS server
class DnsServer(asyncio.DatagramProtocol):
    """Answers A (and, empty, other) queries from `lookup`; authoritative, no recursion."""

    def __init__(self, lookup: Callable[[str], list[str] | None]) -> None:
        self.lookup = lookup
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            query = dns.message.from_wire(data)
        except Exception:  # not a DNS message: nothing to answer
            return
        if self.transport is not None:
            self.transport.sendto(answer(query, self.lookup).to_wire(), addr)


def answer(query: dns.message.Message, lookup: Callable[[str], list[str] | None]) -> Any:
    response = dns.message.make_response(query)
    response.flags |= dns.flags.AA
    response.flags &= ~dns.flags.RA
    if len(query.question) != 1:
        response.set_rcode(dns.rcode.FORMERR)
        return response
    question = query.question[0]
    name = question.name.to_text(omit_final_dot=True).lower()
    found = lookup(name)
    if found is None:
        response.set_rcode(dns.rcode.NXDOMAIN)
    elif question.rdtype == dns.rdatatype.A and found:
        rrset = dns.rrset.from_text_list(
            question.name, 5, dns.rdataclass.IN, dns.rdatatype.A, found
        )
        response.answer.append(rrset)
    return response  # a name with no A record of this type: NOERROR, no answer
