# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Slice host parity: one PASS/FAIL/WARN result per condition of the parity target
(docs/slice-host.md, "Parity target").

The checks look at behaviour, not package presence: a loaded module, a bridge that owns
the gateway address, a dnsmasq process in this network namespace with a DHCP range in
the GPU subnet and a socket on port 67, a libvirt socket that accepts a connection, the
NAT rule as iptables reports it. File-based checks (modules, /dev/kvm, IOMMU groups,
netplan, systemd units) read under `root`; network checks read the live namespace.

The line format (parity_lines.py) is shared with the MAAS commissioning script:

    GPUAAS_SLICE_PARITY status=FAIL check=ipoib_netplan detail=command\\ exited\\ with\\ 1 \
remediation=render\\ /etc/netplan/60-ipoib.yaml\\ from\\ site/profile\\ bootstrap
    GPUAAS_SLICE_PARITY_SUMMARY status=FAIL checks=16 passed=14 failures=1 warnings=1

Values escape backslash, space, tab, CR and newline with a backslash; `parse_lines`
reverses `format_lines` exactly.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import datetime
import ipaddress
import json
import os
import socket
from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Tuple
from xml.etree import ElementTree

from ansible_collections.gpuaas.fleet.plugins.module_utils import (
    checks,
    netstate,
    procfs,
    service_manager,
    sriov_vfs,
    sysfs,
    topology,
    vm_common,
)

# The line format lives in parity_lines; its names stay reachable here for the modules,
# firmware_preflight and the MAAS script test, which read results and lines from parity.
from ansible_collections.gpuaas.fleet.plugins.module_utils.parity_lines import (  # noqa: F401  # pylint: disable=unused-import
    FAIL,
    LINE_PREFIX,
    PASS,
    STATUSES,
    SUMMARY_PREFIX,
    WARN,
    ParityError,
    escape,
    format_line,
    format_lines,
    format_summary,
    parse_line,
    parse_lines,
    result,
    summarize,
)

try:
    import yaml
except ImportError:  # PyYAML (python3-yaml) ships with netplan; without it, say so
    yaml = None

CHECKS = (
    "vfio",
    "kvm",
    "iommu",
    "sriov_vfs",
    "ipoib_netplan",
    "fabric_address",
    "fabric_route",
    "bridge",
    "dnsmasq",
    "libvirt",
    "vnic_bandwidth",
    "nat",
    "ip_forward",
    "slice_isolation",
    "tmfifo",
    "historical_network_service",
    "api_topology",
)
NETWORK_CHECKS = frozenset(
    ("fabric_address", "fabric_route", "bridge", "nat", "slice_isolation", "tmfifo", "dnsmasq")
)
IPOIB_NETPLAN = "/etc/netplan/60-ipoib.yaml"
NETWORK_SERVICE = "gpuaas-slice-network-baseline"
HISTORICAL_NETWORK_SERVICE = "gpuaas-slice-host-net-baseline"
UNIT_DIRS = ("/etc/systemd/system", "/lib/systemd/system", "/usr/lib/systemd/system")
# Where a service run without systemd leaves its pid (direct mode).
PIDFILE_DIRS = ("/run", "/var/run")
SCRIPT_SHELLS = ("sh", "bash", "dash")
DEFAULT_TOPOLOGY_MAX_AGE = "24h"
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# Evidence stamped further in the future than this is not trusted (clock skew allowance).
FUTURE_SKEW_SECONDS = 300
LIBVIRT_SOCKETS = ("/run/libvirt/virtqemud-sock", "/run/libvirt/libvirt-sock")
# libvirt's QEMU driver keeps the live definition of each running domain here.
LIBVIRT_QEMU_STATUS = "/run/libvirt/qemu"
DNSMASQ_DEFAULT_CONF = "/etc/dnsmasq.conf"
DHCP_SERVER_PORT = 67
# What a guest must not open on the node or in the infrastructure (sshd, DNS/HTTP of other
# hosts, etcd, Prefect, PostgreSQL, exporters, libvirt, NTP, SNMP, IPMI/BMC, mDNS); and
# what it must still reach: DHCP and DNS on its gateway, NAT egress (docs/security.md).
DENIED_PORTS = (
    ("tcp", 22),
    ("tcp", 80),
    ("tcp", 443),
    ("tcp", 2379),
    ("tcp", 4200),
    ("tcp", 5432),
    ("tcp", 8080),
    ("tcp", 9100),
    ("tcp", 16509),
    ("tcp", 16514),
    ("udp", 123),
    ("udp", 161),
    ("udp", 623),
    ("udp", 5353),
)
INFRA_PROBES = (("tcp", 22), ("tcp", 443), ("udp", 623))
# Destinations standing for the internet; the first outside the infrastructure is probed.
EGRESS_PROBES = ("1.1.1.1", "9.9.9.9", "8.8.8.8", "198.51.100.1")
OVS_GUEST_FLOWS = ("in_port=LOCAL", "dl_dst=01:00:00:00:00:00/01:00:00:00:00:00")
ADVISORY_BLOCKER_CODES = frozenset(
    ("tmfifo_missing", "default_route_missing", "reboot_required", "network_evidence_error")
)

# --------------------------------------------------------------------------- context


@dataclass
class ParityContext:
    host: sysfs.HostRoot
    bridge: str = "ovsbr0"
    slice_subnet: str = "10.100.0.0/24"
    tmfifo_interface: str = "tmfifo_net0"
    fabric_subnet: Optional[str] = None
    libvirt_sockets: Tuple[str, ...] = LIBVIRT_SOCKETS
    topology_evidence: Optional[dict] = None
    # The control plane's newest stored evidence: None = not given, "" = it has none.
    topology_collected_at: Optional[str] = None
    topology_blockers: Optional[list] = None
    max_age_seconds: int = 86400
    runner: Callable = netstate.default_runner
    proc: str = "/proc"
    # None: detect the live service manager (systemd or direct) when a check needs it.
    manager: Optional[str] = None
    pidfile_dirs: Tuple[str, ...] = PIDFILE_DIRS
    now: Optional[datetime.datetime] = None
    evidence: Optional[dict] = field(default=None, repr=False)
    infra_networks: Tuple[str, ...] = netstate.DEFAULT_INFRA_NETWORKS

    def network(self):
        if self.evidence is None:
            self.evidence = netstate.collect(
                self.runner, self.bridge, self.slice_subnet, self.tmfifo_interface
            )
        return self.evidence


# ---------------------------------------------------------------------------- checks


def check_vfio(ctx):
    modules = sysfs.loaded_modules(ctx.host)
    missing = [m for m in sysfs.VFIO_MODULES if m not in modules]
    if missing:
        return result(
            "vfio",
            FAIL,
            "not loaded: " + ", ".join(missing),
            "load vfio, vfio_pci and vfio_iommu_type1 at boot (modules-load.d) via host bootstrap",
        )
    return result("vfio", PASS, "loaded: " + ", ".join(sysfs.VFIO_MODULES))


def check_kvm(ctx):
    return checks.check_kvm(ctx.host.path("/dev/kvm"))


def check_iommu(ctx):
    groups = sysfs.iommu_group_count(ctx.host)
    cmdline = sysfs.cmdline_has_iommu(ctx.host.read("/proc/cmdline"))
    detail = f"iommu_groups={groups} cmdline_iommu={'yes' if cmdline else 'no'}"
    if groups > 0:
        return result("iommu", PASS, detail)
    return result(
        "iommu",
        FAIL,
        detail,
        "enable VT-d/AMD-Vi in firmware, add intel_iommu=on iommu=pt (amd_iommu=on) and reboot",
    )


def check_sriov_vfs(ctx):
    """The VF counts the bootstrap wrote (sriov_vfs.CONFIG_PATH) are what the PFs have, each
    VF has an IOMMU group, and each VF with a vfio-pci override is on vfio-pci."""
    name = "sriov_vfs"
    remediation = (
        "run the bootstrap with slice_host_bootstrap_sriov_pfs, or "
        "systemctl restart gpuaas-sriov-vfs and check its journal"
    )
    text = ctx.host.read(sriov_vfs.CONFIG_PATH)
    if text is None:
        return result(name, PASS, "no VF counts configured (slice_host_bootstrap_sriov_pfs)")
    try:
        document = json.loads(text)
        entries = [sriov_vfs.normalize_entry(e, i) for i, e in enumerate(document["pfs"])]
        resolved = sriov_vfs.resolve(ctx.host, entries)
    except (ValueError, KeyError, TypeError) as exc:
        return result(name, FAIL, f"{sriov_vfs.CONFIG_PATH}: {exc}", remediation)
    problems, counts = [], []
    for entry, addresses in resolved:
        for address in addresses:
            pf = sysfs.read_pci_function(ctx.host, address)
            if pf.sriov_numvfs != entry["numvfs"] or len(pf.virtfns) != entry["numvfs"]:
                problems.append(
                    f"{address} has {pf.sriov_numvfs} VFs ({len(pf.virtfns)} present), "
                    f"{entry['numvfs']} wanted"
                )
            on_vfio = 0
            for vf_address in pf.virtfns:
                vf = sysfs.read_pci_function(ctx.host, vf_address)
                if vf.iommu_group is None:
                    problems.append(f"VF {vf_address} has no IOMMU group")
                wanted = sysfs.driverctl_override(ctx.host, vf_address)
                if wanted and vf.driver != wanted:
                    problems.append(
                        f"VF {vf_address} is on {vf.driver or 'no driver'}, not {wanted}"
                    )
                on_vfio += vf.driver == sysfs.VFIO_DRIVER
            counts.append(f"{address}={len(pf.virtfns)}/{pf.sriov_totalvfs} (vfio-pci {on_vfio})")
    if problems:
        return result(name, FAIL, "; ".join(problems), remediation)
    return result(name, PASS, ", ".join(counts) or "no PF configured")


def _ipoib_name(device_id, config):
    """The ibp* name a netplan device entry configures (its id, set-name or match), or None."""
    match = config.get("match") if isinstance(config.get("match"), dict) else {}
    for name in (device_id, config.get("set-name"), match.get("name")):
        if isinstance(name, str) and name.startswith(netstate.FABRIC_INTERFACE_PREFIX):
            return name
    return None


def _ipv4_addresses(entries):
    """IPv4 CIDRs of a netplan `addresses` list (plain strings or {cidr: options})."""
    found = []
    for entry in entries if isinstance(entries, list) else []:
        for text in entry if isinstance(entry, dict) else [entry]:
            try:
                address = ipaddress.ip_interface(str(text))
            except ValueError:
                continue
            if address.version == 4:
                found.append(str(address))
    return found


def netplan_ipoib(text):
    """{ibp* interface: [IPv4 CIDR...]} that a netplan document configures.

    Every device section (ethernets, bonds, vlans, ...) is searched, so an IPoIB
    interface renamed with set-name or matched by name counts too. ParityError when the
    text is not a netplan document.
    """
    if yaml is None:
        raise ParityError("cannot parse it: PyYAML (python3-yaml) is not installed on the host")
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ParityError(f"is not valid YAML: {str(exc).splitlines()[0]}") from None
    network = document.get("network") if isinstance(document, dict) else None
    if not isinstance(network, dict):
        raise ParityError("has no network: mapping")
    interfaces = {}
    for section in network.values():
        if not isinstance(section, dict):
            continue
        for device_id, config in section.items():
            if not isinstance(config, dict):
                continue
            name = _ipoib_name(str(device_id), config)
            if name:
                interfaces.setdefault(name, []).extend(_ipv4_addresses(config.get("addresses")))
    return interfaces


def _in_subnet(cidr, subnet):
    return subnet is None or ipaddress.ip_interface(cidr).ip in subnet


def _show(owned):
    return ", ".join(f"{name}={' '.join(addrs)}" for name, addrs in sorted(owned.items()))


def check_ipoib_netplan(ctx):
    remediation = f"render {IPOIB_NETPLAN} from site/profile bootstrap"
    content = ctx.host.read(IPOIB_NETPLAN)
    if not content:
        state = "is empty" if content == "" else "is missing"
        return result("ipoib_netplan", FAIL, f"{IPOIB_NETPLAN} {state}", remediation)
    try:
        interfaces = netplan_ipoib(content)
    except ParityError as exc:
        fix = "install python3-yaml" if yaml is None else remediation
        return result("ipoib_netplan", FAIL, f"{IPOIB_NETPLAN} {exc}", fix)
    if not interfaces:
        return result(
            "ipoib_netplan", FAIL, f"{IPOIB_NETPLAN} configures no ibp* interface", remediation
        )
    subnet = _fabric_network(ctx)
    owned = {name: addrs for name, addrs in interfaces.items() if addrs}
    if not owned:
        return result(
            "ipoib_netplan",
            FAIL,
            f"{IPOIB_NETPLAN} gives no IPv4 address to {', '.join(sorted(interfaces))}",
            remediation,
        )
    inside = {n: [a for a in addrs if _in_subnet(a, subnet)] for n, addrs in owned.items()}
    inside = {n: addrs for n, addrs in inside.items() if addrs}
    if not inside:
        return result(
            "ipoib_netplan",
            FAIL,
            f"{IPOIB_NETPLAN} addresses {_show(owned)} are outside the fabric subnet {subnet}",
            remediation,
        )
    return result("ipoib_netplan", PASS, f"{IPOIB_NETPLAN} configures {_show(inside)}")


def _fabric_network(ctx):
    return ipaddress.ip_network(ctx.fabric_subnet, strict=False) if ctx.fabric_subnet else None


def check_fabric_address(ctx):
    evidence = ctx.network()
    interfaces = netstate.fabric_interfaces(evidence)
    subnet = _fabric_network(ctx)
    where = f" in {subnet}" if subnet else ""
    remediation = (
        f"apply {IPOIB_NETPLAN} so an ibp* interface is up and owns the site fabric "
        f"address{where} with its route"
    )
    if not interfaces:
        return result("fabric_address", FAIL, "no ibp* interface", remediation)
    owned = {name: info["ipv4"] for name, info in interfaces.items() if info["ipv4"]}
    if not owned:
        detail = f"ibp* interfaces without IPv4: {', '.join(sorted(interfaces))}"
        return result("fabric_address", FAIL, detail, remediation)
    candidates = [
        (name, cidr) for name in sorted(owned) for cidr in owned[name] if _in_subnet(cidr, subnet)
    ]
    if not candidates:
        detail = f"no ibp* address{where} (has: {_show(owned)})"
        return result("fabric_address", FAIL, detail, remediation)
    for name, cidr in candidates:
        routes = netstate.routes_for_address(evidence, name, cidr)
        if interfaces[name]["up"] and routes:
            return result("fabric_address", PASS, f"{name}={cidr}, route {routes[0]['dst']}")
    name, cidr = candidates[0]
    problem = "is down" if not interfaces[name]["up"] else "has no route that reaches it"
    return result("fabric_address", FAIL, f"{name} owns {cidr} but {problem}", remediation)


def check_fabric_route(ctx):
    routes = netstate.fabric_routes(ctx.network(), ctx.fabric_subnet)
    wanted = f" for {ctx.fabric_subnet}" if ctx.fabric_subnet else ""
    if routes:
        shown = ", ".join(f"{r.get('dst')} dev {r.get('dev')}" for r in routes)
        return result("fabric_route", PASS, shown)
    return result(
        "fabric_route",
        FAIL,
        f"no route over an ibp* interface{wanted}",
        f"add the fabric route{wanted} to {IPOIB_NETPLAN} and apply it",
    )


def check_bridge(ctx):
    net = ctx.network()
    remediation = (
        f"run the slice network baseline so {ctx.bridge} is an up Linux or Open vSwitch "
        f"bridge that owns {net['gateway']}"
    )
    return checks.check_bridge(net, remediation, gateway=net["gateway"])


def _read_live(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def _dnsmasq_options(argv):
    """(key, value) pairs from a dnsmasq command line, long and short forms."""
    short = {"-F": "dhcp-range", "-C": "conf-file", "-7": "conf-dir", "-i": "interface"}
    pairs, i = [], 1
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            key, sep, value = arg[2:].partition("=")
            if not sep and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                value, i = argv[i + 1], i + 1
            pairs.append((key, value))
        elif arg[:2] in short:
            value = arg[2:]
            if not value and i + 1 < len(argv):
                value, i = argv[i + 1], i + 1
            pairs.append((short[arg[:2]], value))
        i += 1
    return pairs


def _conf_dir_files(base, spec):
    directory, *filters = spec.split(",")
    include = [f[1:] for f in filters if f.startswith("*")]
    exclude = [f for f in filters if not f.startswith("*")]
    try:
        names = sorted(os.listdir(base + directory))
    except OSError:
        return []
    chosen = []
    for name in names:
        if (
            name.startswith(".")
            or name.endswith("~")
            or (name.startswith("#") and name.endswith("#"))
        ):
            continue
        if include and not any(name.endswith(ext) for ext in include):
            continue
        if any(name.endswith(ext) for ext in exclude):
            continue
        chosen.append(os.path.join(directory, name))
    return chosen


def dnsmasq_ranges(argv, fs_base):
    """dhcp-range values of one dnsmasq (command line + config files read via fs_base)."""
    options = _dnsmasq_options(argv)
    ranges = [value for key, value in options if key == "dhcp-range"]
    files = [value for key, value in options if key == "conf-file" and value]
    dirs = [value for key, value in options if key == "conf-dir" and value]
    if not any(key == "conf-file" for key, _value in options):
        files.append(DNSMASQ_DEFAULT_CONF)
    seen = set()
    while files or dirs:
        for spec in dirs:
            files.extend(_conf_dir_files(fs_base, spec))
        dirs = []
        path = files.pop(0) if files else None
        if path is None or path in seen:
            continue
        seen.add(path)
        for raw in (_read_live(fs_base + path) or "").splitlines():
            line = raw.split("#", 1)[0].strip()
            key, sep, value = line.partition("=")
            key = key.strip()
            if key == "dhcp-range" and sep:
                ranges.append(value.strip())
            elif key == "conf-file" and sep:
                files.append(value.strip())
            elif key == "conf-dir" and sep:
                dirs.append(value.strip())
    return ranges


def range_in_subnet(dhcp_range, subnet):
    network = ipaddress.ip_network(subnet)
    for token in dhcp_range.split(","):
        try:
            return ipaddress.ip_address(token.strip()) in network
        except ValueError:
            continue
    return False


def dnsmasq_processes(proc="/proc"):
    """(pid, argv) of dnsmasq processes in the caller's network namespace."""
    own = procfs.netns_inode("self", proc)
    found = []
    for pid in sorted((p for p in os.listdir(proc) if p.isdigit()), key=int):
        if (_read_live(f"{proc}/{pid}/comm") or "").strip() != "dnsmasq":
            continue
        if own is None or procfs.netns_inode(pid, proc) != own:
            continue
        argv = [a for a in (_read_live(f"{proc}/{pid}/cmdline") or "").split("\0") if a]
        if argv:
            found.append((int(pid), argv))
    return found


def socket_inodes(pid, proc="/proc"):
    """Inodes of the sockets process `pid` holds open; None when its fds are unreadable."""
    try:
        fds = os.listdir(f"{proc}/{pid}/fd")
    except OSError:
        return None
    inodes = set()
    for fd in fds:
        try:
            target = os.readlink(f"{proc}/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target.endswith("]"):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def udp_port_inodes(port, proc="/proc", pid="self"):
    """Inodes of the UDP sockets bound to `port` in the network namespace of `pid`."""
    inodes = set()
    for table in ("net/udp", "net/udp6"):
        for line in (_read_live(f"{proc}/{pid}/{table}") or "").splitlines()[1:]:
            fields = line.split()
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
            if len(fields) > 9 and fields[1].rsplit(":", 1)[-1].upper() == f"{port:04X}":
                inodes.add(fields[9])
    return inodes


def check_dnsmasq(ctx):
    subnet = str(ipaddress.ip_network(ctx.slice_subnet))
    remediation = f"start dnsmasq with a dhcp-range in {subnet} on {ctx.bridge} (network baseline)"
    processes = dnsmasq_processes(ctx.proc)
    if not processes:
        return result("dnsmasq", FAIL, "no dnsmasq process in this network namespace", remediation)
    serving = []
    for pid, argv in processes:
        ranges = [
            r for r in dnsmasq_ranges(argv, f"{ctx.proc}/{pid}/root") if range_in_subnet(r, subnet)
        ]
        if ranges:
            serving.append((pid, ranges))
    if not serving:
        pids = ", ".join(str(pid) for pid, _argv in processes)
        return result(
            "dnsmasq", FAIL, f"dnsmasq pid {pids} has no dhcp-range in {subnet}", remediation
        )
    problems = []
    for pid, ranges in serving:
        held = socket_inodes(pid, ctx.proc)
        if held is None:
            problems.append(f"cannot read /proc/{pid}/fd (run the check as root)")
            continue
        listening = udp_port_inodes(DHCP_SERVER_PORT, ctx.proc, pid)
        if held & listening:
            return result("dnsmasq", PASS, f"pid {pid} serves {subnet} (dhcp-range {ranges[0]})")
        owner = "; port 67 is held by another process" if listening else ""
        problems.append(f"pid {pid} holds no UDP port 67 socket{owner}")
    return result(
        "dnsmasq",
        FAIL,
        f"dnsmasq has a dhcp-range in {subnet} but {'; '.join(problems)}",
        remediation,
    )


def check_libvirt(ctx):
    errors = []
    for path in ctx.libvirt_sockets:
        if not os.path.exists(path):
            errors.append(f"{path} missing")
            continue
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(2.0)
        try:
            sock.connect(path)
        except OSError as exc:
            errors.append(f"{path}: {exc.strerror or exc}")
            continue
        finally:
            sock.close()
        return result("libvirt", PASS, f"{path} accepts connections")
    return result(
        "libvirt",
        FAIL,
        "no libvirt daemon answers (" + "; ".join(errors) + ")",
        "start libvirtd (or virtqemud) before launching slice VMs",
    )


def check_vnic_bandwidth(ctx):
    """Each running slice VM's vNIC rates as libvirt applied them (its status XML), so a
    parity run shows them, and whether the kernel really shapes them on the VM's tap: libvirt
    and Open vSwitch accept rates a kernel without the qdisc or police action cannot apply,
    and Open vSwitch then only logs a warning (docs/slice-host.md, "Per-vNIC QoS"). Whether
    the rates are the SKU's is reconcile's to judge."""
    name = "vnic_bandwidth"
    shaped, unreadable, unenforced = [], [], []
    for entry in ctx.host.listdir(LIBVIRT_QEMU_STATUS):
        if not (entry.startswith(vm_common.DOMAIN_PREFIX) and entry.endswith(".xml")):
            continue
        domain_name = entry[: -len(".xml")]
        try:
            root = ElementTree.fromstring(ctx.host.read(f"{LIBVIRT_QEMU_STATUS}/{entry}") or "")
        except ElementTree.ParseError as exc:
            unreadable.append(f"{domain_name}: {exc}")
            continue
        domain = root if root.tag == "domain" else root.find("domain")
        for nic in [] if domain is None else domain.findall("devices/interface"):
            mac = nic.find("mac")
            address = (mac.get("address") or "?").lower() if mac is not None else "?"
            rates = vm_common.read_bandwidth(nic)
            shaped.append(f"{domain_name} {address} {vm_common.describe_bandwidth(rates)}")
            if rates:
                problem, readable = _unshaped_directions(ctx, nic, rates)
                if problem:
                    (unenforced if readable else unreadable).append(
                        f"{domain_name} {address} {problem}"
                    )
    if unenforced:
        return result(
            name,
            FAIL,
            "rates not applied by the kernel: " + "; ".join(unenforced),
            "the kernel needs sch_htb and sch_sfq (Linux bridge) and cls_u32 or cls_basic "
            "with act_police for outbound rates (docs/slice-host.md, Per-vNIC QoS)",
        )
    if unreadable:
        return result(
            name,
            WARN,
            "unreadable: " + "; ".join(unreadable),
            "check libvirtd and tc; virsh dumpxml shows the live definition",
        )
    return result(name, PASS, "; ".join(shaped) or "no slice VM running")


def _unshaped_directions(ctx, nic, rates):
    """(what is not shaped on the nic's tap, or '', and whether the tap could be read)."""
    target = nic.find("target")
    device = target.get("dev") if target is not None else None
    if not device:
        return "has no tap device in its live definition", False
    shaping = netstate.tap_shaping(ctx.runner, device)
    if shaping["errors"]:
        return f"tap {device}: " + "; ".join(shaping["errors"]), False
    missing = [d for d in vm_common.BANDWIDTH_DIRECTIONS if d in rates and not shaping[d]]
    return (f"{' and '.join(missing)} not shaped on {device}" if missing else ""), True


def check_nat(ctx):
    net = ctx.network()
    if net["nat_masquerade"]:
        return result("nat", PASS, net["nat_rule"])
    errors = f" ({'; '.join(net['errors'])})" if net["errors"] else ""
    return result(
        "nat",
        FAIL,
        f"no MASQUERADE rule for {net['subnet']}{errors}",
        f"iptables -t nat -A POSTROUTING -s {net['subnet']} -j MASQUERADE via the network "
        "baseline service",
    )


def check_ip_forward(ctx):
    forwarding = procfs.read_ip_forward()
    if forwarding:
        return result("ip_forward", PASS, "net.ipv4.ip_forward=1")
    return result(
        "ip_forward",
        FAIL,
        "net.ipv4.ip_forward=0" if forwarding is False else "net.ipv4.ip_forward unreadable",
        "sysctl -w net.ipv4.ip_forward=1 and persist it in /etc/sysctl.d",
    )


def _probe_address(network, subnet):
    """An address of infrastructure `network` that is not in the slice subnet."""
    for address in (network.network_address + 1, network.broadcast_address - 1):
        if address not in subnet:
            return str(address)
    return str(network.network_address)


def _show_port(proto, port):
    return f"{proto}/{port}"


def _containment_problems(ctx, net, chains):
    """What of the containment the live filter table does not do, one phrase each."""
    bridge = ctx.bridge
    subnet = ipaddress.ip_network(net["subnet"])
    gateway = str(netstate.gateway_interface(net["subnet"]).ip)
    guest, other_guest = (str(address) for address in list(subnet.hosts())[1:3])
    uplink = net.get("default_route_uplink")
    infra = [ipaddress.ip_network(n) for n in ctx.infra_networks]
    problems = []

    def verdict(chain, **packet):
        return netstate.evaluate(chains, chain, netstate.probe(bridge, guest, **packet))

    for network in infra:
        target = _probe_address(network, subnet)
        for proto, port in INFRA_PROBES:
            decided, rule = verdict(
                "FORWARD", dst=target, proto=proto, dport=port, out_iface=uplink
            )
            if decided == "ACCEPT":
                problems.append(
                    f"FORWARD from {bridge} to {network} not dropped "
                    f"({_show_port(proto, port)} to {target} accepted by: {rule})"
                )
                break
    decided, rule = verdict("FORWARD", dst=other_guest, proto="tcp", dport=22, out_iface=bridge)
    if decided == "ACCEPT":
        problems.append(
            f"FORWARD from {bridge} back into {bridge} (slice to slice) not dropped "
            f"(accepted by: {rule})"
        )
    outside = [a for a in EGRESS_PROBES if not any(ipaddress.ip_address(a) in n for n in infra)]
    if outside:
        decided, rule = verdict("FORWARD", dst=outside[0], proto="tcp", dport=443, out_iface=uplink)
        if decided != "ACCEPT":
            problems.append(
                f"FORWARD from {bridge} to the internet (tcp/443 to {outside[0]}) not accepted "
                f"(dropped by: {rule})"
            )
    own = sorted(
        {
            str(ipaddress.ip_interface(cidr).ip)
            for info in net["interfaces"].values()
            for cidr in info.get("ipv4") or []
            if not ipaddress.ip_interface(cidr).ip.is_loopback
        }
        | {gateway}
    )
    for address in own:
        opened = []
        for proto, port in DENIED_PORTS if address == gateway else INFRA_PROBES:
            decided, rule = verdict("INPUT", dst=address, proto=proto, dport=port)
            if decided == "ACCEPT":
                opened.append((_show_port(proto, port), rule))
        if opened:
            ports = ", ".join(port for port, _rule in opened)
            problems.append(
                f"INPUT from {bridge} accepts {ports} (to {address}, first by: {opened[0][1]})"
            )
    needed = (
        # A client without a lease broadcasts from 0.0.0.0; a renewal is unicast.
        ("udp/67 (DHCP)", "0.0.0.0", "255.255.255.255", "udp", 67),
        ("udp/67 (DHCP renewal)", guest, gateway, "udp", 67),
        ("udp/53 (DNS)", guest, gateway, "udp", 53),
        ("tcp/53 (DNS)", guest, gateway, "tcp", 53),
    )
    for label, source, destination, proto, port in needed:
        packet = netstate.probe(
            bridge, source, destination, proto, port, sport=68 if port == 67 else 40000
        )
        decided, rule = netstate.evaluate(chains, "INPUT", packet)
        if decided != "ACCEPT":
            problems.append(f"INPUT from {bridge} drops {label} to {destination} (by: {rule})")
    return problems


def _layer2_problems(ctx, contained):
    """Guests kept apart at layer 2 (the baseline's OpenFlow rules or ebtables chain)."""
    bridge = ctx.bridge
    flows = contained["ovs_flows"]
    if flows is not None:
        allowed = list(OVS_GUEST_FLOWS)
        if contained["bridge_mac"]:
            allowed.append(f"dl_dst={contained['bridge_mac']}")
        problems = []
        if "priority=0 actions=drop" not in flows:
            problems.append(f"OVS {bridge} has no priority=0 drop flow")
        for flow in flows:
            match, _sep, actions = flow.partition(" actions=")
            if actions != "drop" and not set(match.split(",")) & set(allowed):
                problems.append(f"OVS {bridge} forwards guest traffic beyond the gateway: {flow}")
        return problems
    forward = contained["ebtables_forward"]
    if forward is not None and "-j GPUAAS-SLICE" not in forward:
        return [
            f"ebtables FORWARD does not jump to GPUAAS-SLICE (slices on {bridge} reach each "
            "other at layer 2)"
        ]
    return []


def check_slice_isolation(ctx):
    """Slice guests are contained on the node, deny by default (docs/security.md): judged
    by running probe packets of a guest through the live filter table (iptables-save),
    so a rule another tool put before the baseline's chains counts as what it does."""
    name = "slice_isolation"
    net = ctx.network()
    bridge = ctx.bridge
    remediation = (
        "run the slice network baseline (systemctl restart gpuaas-slice-network-baseline, or "
        "the slice_network_baseline role) and remove rules that accept the bridge's traffic "
        "before its chains (docs/security.md)"
    )
    if not net["bridge_link"]:
        return result(name, FAIL, f"{bridge} does not exist: no containment to judge", remediation)
    contained = netstate.containment_evidence(ctx.runner, bridge, net["bridge_kind"])
    if contained["filter"] is None:
        return result(name, FAIL, "; ".join(contained["errors"]), remediation)
    problems = _containment_problems(ctx, net, contained["filter"])
    if contained["ipv6_disabled"] is False:
        problems.append(f"IPv6 from {bridge} is received (net.ipv6.conf.{bridge}.disable_ipv6=0)")
    problems += _layer2_problems(ctx, contained)
    problems += [e for e in contained["errors"] if not e.startswith("sysctl")]
    if problems:
        return result(name, FAIL, "; ".join(problems), remediation)
    layer2 = (
        "OpenFlow rules isolate guests"
        if contained["ovs_flows"] is not None
        else "ebtables isolates slots"
    )
    return result(
        name,
        PASS,
        f"{bridge}: FORWARD drops {', '.join(ctx.infra_networks)} and slice to slice, NAT "
        f"egress accepted; INPUT accepts only DHCP and DNS to the gateway; IPv6 off; {layer2}",
    )


def check_tmfifo(ctx):
    net = ctx.network()
    if net["tmfifo_ipv4"]:
        return result("tmfifo", PASS, f"{ctx.tmfifo_interface} has {net['tmfifo_ipv4']}")
    state = "has no IPv4 address" if net["tmfifo_present"] else "is absent"
    return result(
        "tmfifo",
        WARN,
        f"{ctx.tmfifo_interface} {state} (optional BF3 RShim management evidence)",
        f"assign 192.168.100.1/30 to {ctx.tmfifo_interface} when the host has a BF3 RShim",
    )


def _unit_exists(host, name):
    return any(host.exists(f"{d}/{name}.service") for d in UNIT_DIRS)


def _runs_service(argv, name):
    """True when a command line executes service `name`'s script (with or without .sh).

    The script is the program itself, or the first operand of a shell running it.
    """
    scripts = (name, name + ".sh")
    if not argv:
        return False
    if os.path.basename(argv[0]) in scripts:
        return True
    if os.path.basename(argv[0]) not in SCRIPT_SHELLS:
        return False
    operands = [a for a in argv[1:] if not a.startswith("-")]
    return bool(operands) and os.path.basename(operands[0]) in scripts


def _live_here(proc, pid, own_netns):
    stat = _read_live(f"{proc}/{pid}/stat") or ""
    if not stat or ") Z " in stat or ") X " in stat:
        return False
    return own_netns is None or procfs.netns_inode(pid, proc) == own_netns


def service_pid(name, proc="/proc", pidfile_dirs=PIDFILE_DIRS):
    """pid of a live process of service `name` in this network namespace, else None.

    Without systemd a service is what runs: a pidfile (<dir>/<name>.pid) whose process
    carries the service's name, or any process executing the service's script.
    """
    own = procfs.netns_inode("self", proc)
    for directory in pidfile_dirs:
        pid = service_manager.pidfile_pid(f"{directory}/{name}.pid")
        if pid is None or not _live_here(proc, pid, own):
            continue
        comm = (_read_live(f"{proc}/{pid}/comm") or "").strip()
        argv = (_read_live(f"{proc}/{pid}/cmdline") or "").split("\0")
        if comm == name[: service_manager.COMM_MAX] or _runs_service(argv, name):
            return pid
    for pid in sorted((p for p in os.listdir(proc) if p.isdigit()), key=int):
        argv = [a for a in (_read_live(f"{proc}/{pid}/cmdline") or "").split("\0") if a]
        if argv and _runs_service(argv, name) and _live_here(proc, pid, own):
            return int(pid)
    return None


def _systemd_state(ctx, name):
    try:
        return service_manager.systemd_status(f"{name}.service", ctx.runner)
    except service_manager.ServiceError as exc:
        return {"error": str(exc)}


def _historical_activity(ctx, manager):
    """How the historical service is still live: ['active', 'enabled'] / ['running (pid N)']."""
    if manager == service_manager.SYSTEMD:
        state = _systemd_state(ctx, HISTORICAL_NETWORK_SERVICE)
        if "error" in state:
            return [f"of unknown state ({state['error']})"]
        live = ["active"] if state["active"] else []
        if state["unit_file_state"].startswith("enabled"):
            live.append("enabled")
        return live
    pid = service_pid(HISTORICAL_NETWORK_SERVICE, ctx.proc, ctx.pidfile_dirs)
    return [f"running (pid {pid})"] if pid is not None else []


def check_historical_network_service(ctx):
    name = "historical_network_service"
    current = _unit_exists(ctx.host, NETWORK_SERVICE)
    historical = _unit_exists(ctx.host, HISTORICAL_NETWORK_SERVICE)
    manager = ctx.manager or service_manager.detect_manager("/")
    retire = f"stop and disable {HISTORICAL_NETWORK_SERVICE}; keep {NETWORK_SERVICE}.service"
    live = _historical_activity(ctx, manager)
    if live:
        installed = "installed" if current else "not installed"
        return result(
            name,
            WARN,
            f"historical {HISTORICAL_NETWORK_SERVICE} is {' and '.join(live)}; "
            f"{NETWORK_SERVICE}.service is {installed}",
            retire + " (the network baseline role retires it)",
        )
    if current and historical:
        return result(
            name,
            WARN,
            f"both {NETWORK_SERVICE} and historical {HISTORICAL_NETWORK_SERVICE} are installed",
            f"remove {HISTORICAL_NETWORK_SERVICE}.service; keep {NETWORK_SERVICE}.service",
        )
    if historical:
        return result(
            name,
            WARN,
            f"only the historical {HISTORICAL_NETWORK_SERVICE}.service is installed",
            f"converge on {NETWORK_SERVICE}.service through the network baseline role",
        )
    if not current:
        return result(
            name,
            FAIL,
            f"neither {NETWORK_SERVICE} nor {HISTORICAL_NETWORK_SERVICE} is installed",
            f"install {NETWORK_SERVICE}.service through the network baseline role",
        )
    if manager != service_manager.SYSTEMD:
        return result(name, PASS, f"{NETWORK_SERVICE}.service installed")
    state = _systemd_state(ctx, NETWORK_SERVICE)
    if "error" in state or not state["unit_file_state"].startswith("enabled"):
        seen = state.get("error") or f"UnitFileState={state['unit_file_state'] or 'unknown'}"
        return result(
            name,
            WARN,
            f"{NETWORK_SERVICE}.service is installed but not enabled at boot ({seen})",
            f"systemctl enable {NETWORK_SERVICE}.service (network baseline role)",
        )
    return result(name, PASS, f"{NETWORK_SERVICE}.service installed and enabled")


def parse_duration(value):
    """Seconds from 86400, "86400", "90s", "30m", "24h" or "7d"; ParityError otherwise."""
    text = str(value).strip().lower()
    number, unit = (text[:-1], text[-1]) if text[-1:] in DURATION_UNITS else (text, "s")
    if not number.isdigit() or int(number) <= 0:
        raise ParityError(
            f"topology_max_age {value!r} is not a positive duration like 3600, 90m, 24h or 7d"
        )
    return int(number) * DURATION_UNITS[unit]


def _parse_time(value):
    stamp = datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=datetime.timezone.utc)
    return stamp


def _is_hard(item):
    if not isinstance(item, dict):
        return True
    severity = item.get("severity")
    if severity:
        return severity == topology.HARD
    return item.get("code") not in ADVISORY_BLOCKER_CODES


def check_api_topology(ctx):
    """Topology evidence: a map from this run or a file, else the control plane's timestamp.

    A map (`topology_evidence`) carries its blockers; the control plane's stored evidence
    is given as `topology_collected_at` (with its `topology_blockers` when known), where
    an empty value means the control plane holds none for this node. Neither: WARN, local
    checks only (enough for a first-pass diagnosis).
    """
    name = "api_topology"
    remediation = (
        "run discover-topology (playbooks/topology_discover.yml) and import its map into the "
        "control plane"
    )
    evidence = ctx.topology_evidence
    if not evidence and ctx.topology_collected_at is not None:
        if not ctx.topology_collected_at:
            return result(
                name,
                FAIL,
                "the control plane holds no topology evidence for this node",
                remediation,
            )
        evidence = {"collected_at": ctx.topology_collected_at, "blockers": ctx.topology_blockers}
    if not evidence:
        return result(
            name, WARN, "no control-plane topology evidence given; local checks only", remediation
        )
    try:
        collected = _parse_time(evidence.get("collected_at"))
    except (TypeError, ValueError):
        return result(
            name,
            FAIL,
            f"topology evidence has no valid collected_at: {evidence.get('collected_at')!r}",
            remediation,
        )
    now = ctx.now or datetime.datetime.now(datetime.timezone.utc)
    age = int((now - collected).total_seconds())
    if age < -FUTURE_SKEW_SECONDS:
        return result(
            name,
            FAIL,
            f"topology evidence is dated {-age}s in the future ({evidence['collected_at']})",
            remediation,
        )
    if age > ctx.max_age_seconds:
        return result(
            name,
            FAIL,
            f"topology evidence is {age}s old (max {ctx.max_age_seconds}s)",
            remediation,
        )
    hard = [b for b in evidence.get("blockers") or [] if _is_hard(b)]
    if hard:
        codes = sorted({b.get("code", "?") if isinstance(b, dict) else str(b) for b in hard})
        return result(
            name,
            FAIL,
            f"{len(hard)} hard blockers: {', '.join(codes)}",
            "resolve the topology blockers, then rediscover",
        )
    return result(name, PASS, f"completed with no hard blockers ({max(age, 0)}s old)")


CHECK_FUNCTIONS = {
    "vfio": check_vfio,
    "kvm": check_kvm,
    "iommu": check_iommu,
    "sriov_vfs": check_sriov_vfs,
    "ipoib_netplan": check_ipoib_netplan,
    "fabric_address": check_fabric_address,
    "fabric_route": check_fabric_route,
    "bridge": check_bridge,
    "dnsmasq": check_dnsmasq,
    "libvirt": check_libvirt,
    "vnic_bandwidth": check_vnic_bandwidth,
    "nat": check_nat,
    "ip_forward": check_ip_forward,
    "slice_isolation": check_slice_isolation,
    "tmfifo": check_tmfifo,
    "historical_network_service": check_historical_network_service,
    "api_topology": check_api_topology,
}


def validate_checks(checks):
    unknown = sorted(set(checks or ()) - set(CHECKS))
    if unknown:
        raise ParityError(f"unknown checks: {', '.join(unknown)}; known: {', '.join(CHECKS)}")


def run_checks(ctx, checks=None):
    """Results for `checks` (all by default) in the parity target's order."""
    validate_inputs(ctx, checks)
    wanted = set(checks) if checks else set(CHECKS)
    return [CHECK_FUNCTIONS[name](ctx) for name in CHECKS if name in wanted]


def check_host(ctx, checks=None, discovery=None):
    """The slice_parity module's answer: the results, their lines and counts.

    With `discovery` (the slice_topology options parity does not share:
    common_args.topology_discovery_spec), the host's topology is discovered first in the
    same module run, so that a fleet sweep's discovery and parity cost one task per host
    (docs/operations.md, "Fleet sweeps"): the map is returned as `topology` and is the
    evidence api_topology judges, and the live network state is read once for both. Every
    input is validated before anything is read; a discovery that fails raises
    topology.TopologyError and checks nothing.
    """
    validate_inputs(ctx, checks)
    discovered = None
    if discovery is not None:
        live = discovery.get("collect_network", True)
        discovered = topology.discover(
            root=ctx.host.root,
            slice_subnet=ctx.slice_subnet,
            bridge=ctx.bridge,
            tmfifo_interface=ctx.tmfifo_interface,
            runner=ctx.runner,
            network_evidence=ctx.network() if live else None,
            **discovery,
        )
        ctx = replace(ctx, topology_evidence=discovered)
    results = run_checks(ctx, checks)
    summary = summarize(results)
    output = dict(
        changed=False,
        results=results,
        lines=format_lines(results),
        failures=summary["failures"],
        warning_count=summary["warnings"],
        summary=summary,
    )
    if discovered is not None:
        output["topology"] = discovered
    return output


def validate_inputs(ctx, checks=None):
    """Raise ParityError for a check name or network the checks cannot use."""
    validate_checks(checks)
    try:
        netstate.gateway_interface(ctx.slice_subnet)
    except ValueError as exc:
        raise ParityError(f"slice_subnet {ctx.slice_subnet!r} is not a network: {exc}") from None
    for entry in ctx.infra_networks:
        try:
            ipaddress.IPv4Network(entry)
        except ValueError as exc:
            raise ParityError(
                f"infra_networks entry {entry!r} is not an IPv4 network: {exc}"
            ) from None
    if ctx.fabric_subnet:
        try:
            ipaddress.ip_network(ctx.fabric_subnet, strict=False)
        except ValueError as exc:
            raise ParityError(
                f"fabric_subnet {ctx.fabric_subnet!r} is not a network: {exc}"
            ) from None
