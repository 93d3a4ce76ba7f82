"""Slice-guest containment measured from inside a real slice guest: a lab slice node
(libvirt, dnsmasq and loop disks in namespaces on this machine) converges the slice network
baseline with the gpuaas.fleet.slice_network_baseline module, then provisions the Debian
slice guest and, on the same node, a second slice guest (the busybox one) through the
provision flow. Around the node stand stand-ins of the operator's infrastructure, each a
listener in a namespace of its own (gpuaas_lab.containment): the node's sshd on its
bridge, management, out-of-band and uplink addresses; the store's PostgreSQL and a second
lab host's sshd on the management network (that host is a listener in a namespace, not a
booted lab host); a BMC's Redfish and IPMI on an out-of-band network; and an 'outside'
service on 198.51.100.10 beyond the uplink's NAT.

From the Debian guest every infrastructure target (and the other slice guest's sshd) must
be refused or unanswered, the outside service must answer, the node's dnsmasq must answer
DNS on the gateway and the guest must hold its DHCP lease. The node itself reaches every
stand-in at the same moment (the control: a target the guest cannot reach is contained,
not down). Each attempt and its result are recorded as ``containment`` evidence of the
allocation, and parity's slice_isolation check, reading the node's rules, agrees.

The same test with containment turned off (the jumps to the baseline's chains deleted
after the guests booted) must fail: it is marked as a strict expected failure raising
ContainmentBreached, which only the containment assertion raises, so it passes only when
the guest did reach the infrastructure."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

from controlplane.enums import EvidenceKind
from flows.allocation import provision_allocation
from flows.fleet import approve_slots, discover_topology, parity_sweep
from gpuaas_lab.containment import (
    DNS_RECORDS,
    ContainmentPeers,
    containment_off,
    converge_baseline,
    measure,
    probe_matrix,
)
from gpuaas_lab.sliceguest import ensure_slice_guest_image
from gpuaas_lab.sliceguest import unavailable_reason as guest_unavailable_reason
from gpuaas_lab.slicehost import LAB_IMAGE, LAB_SKU, LabSliceHost, unavailable_reason
from gpuaas_lab.vmguest import ensure_guest_image
from gpuaas_lab.vmlab import ovs_unavailable_reason
from tests.integration.flows.conftest import DEBIAN_IMAGE, flow_control_plane
from tests.integration.flows.test_allocation_flows import add_catalog_image

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    pytest.mark.vm,
    pytest.mark.xdist_group("prefect"),
]

USER = "tenant"
ACTOR = "test_guest_containment_measured"


class ContainmentBreached(AssertionError):
    """The guest's attempts are not what containment means (the only failure the test with
    containment off may end in)."""


@pytest.fixture
def contained_node(request, tmp_path, database_url, monkeypatch, prefect_harness):
    """A lab slice node among the containment stand-ins, its slots (two) approved and its
    baseline converged by the module with the slots' MACs, both guest images in the
    catalog; on a Linux bridge or, parametrized indirectly with ``openvswitch``, on the
    userspace Open vSwitch."""
    bridge_type = request.param
    reason = (
        unavailable_reason()
        or guest_unavailable_reason()
        or (ovs_unavailable_reason() if bridge_type == "openvswitch" else None)
    )
    cp = flow_control_plane(reason, tmp_path, database_url, monkeypatch)
    cp.define_sku(LAB_SKU)
    with (
        ContainmentPeers(tmp_path / "peers") as peers,
        LabSliceHost(
            tmp_path / "host",
            slots=2,
            disk_mib=2048,
            guest_image=ensure_slice_guest_image,
            bridge_type=bridge_type,
            uplink_peer=peers.outside,
            dns_records=DNS_RECORDS,
        ) as host,
    ):
        peers.attach(host.lab)
        host.enroll(cp)
        discover_topology(hostnames=[host.hostname])
        approve_slots(host.hostname)
        reservations = cp.inventory([host.hostname])["all"]["hosts"][host.hostname][
            "gpuaas_slot_reservations"
        ]
        assert len(reservations) == 2, reservations
        converge_baseline(host.lab, [r["mac"] for r in reservations], tmp_path / "baseline")
        engine = cp.engine
        assert host.image is not None
        add_catalog_image(
            engine, DEBIAN_IMAGE, host.image.sha256, str(host.image.path), [LAB_SKU.slug]
        )
        busybox = ensure_guest_image()
        add_catalog_image(engine, LAB_IMAGE, busybox.sha256, str(busybox.path), [LAB_SKU.slug])
        yield cp, host


def provision(cp, host, image: str):
    """One GPU of the lab SKU booting `image`, through the provision flow: (allocation id,
    guest address, tenant key)."""
    key, public = host.lab.ssh_keypair(f"{USER}-{image}")
    state = provision_allocation(
        LAB_SKU.slug,
        1,
        image,
        [{"name": USER, "ssh_authorized_keys": [public]}],
        return_state=True,
    )
    provisioned = state.result()
    assert provisioned["state"] == "active", provisioned
    allocation = provisioned["allocation_id"]
    return allocation, cp.runtime_spec(uuid.UUID(allocation)).private_ip, key


def containment_evidence(engine, allocation: str) -> list[dict]:
    with engine.connect() as conn:
        return [
            {"passed": row.passed, "summary": row.summary, **row.payload}
            for row in conn.execute(
                text(
                    "SELECT passed, summary, payload FROM evidence"
                    " WHERE kind = 'containment' AND allocation_id = :allocation"
                ),
                {"allocation": allocation},
            )
        ]


# Large labs (make test-lab): the Debian guest built from packages and booted under TCG,
# on a Linux bridge (ebtables between the guests) and on the userspace Open vSwitch
# (OpenFlow rules between them).
@pytest.mark.lab
@pytest.mark.parametrize("contained_node", ["linux", "openvswitch"], indirect=True)
@pytest.mark.parametrize(
    "containment",
    [
        "on",
        pytest.param(
            "off",
            marks=pytest.mark.xfail(
                strict=True,
                raises=ContainmentBreached,
                reason="containment off: the guest reaches the operator's infrastructure",
            ),
        ),
    ],
)
def test_a_slice_guest_reaches_only_dhcp_dns_and_the_outside(contained_node, containment):
    cp, host = contained_node
    # Both guests took their DHCP lease and answered SSH (the readiness gate) with the
    # node's containment on.
    allocation, guest, key = provision(cp, host, DEBIAN_IMAGE)
    _, neighbor, _ = provision(cp, host, LAB_IMAGE)
    turned_off = containment_off(host.lab) if containment == "off" else []
    assert bool(turned_off) == (containment == "off"), turned_off

    measured = measure(host.lab, guest, USER, key, probe_matrix(host.lab.gateway, neighbor))
    print(f"containment {containment}, from {guest}:\n{measured.table()}")
    breaches = measured.breaches()
    cp.record_evidence(
        host.hostname,
        EvidenceKind.CONTAINMENT,
        not breaches,
        measured.summary(),
        measured.as_evidence(allocation_id=allocation, turned_off=turned_off),
        ACTOR,
        allocation_id=uuid.UUID(allocation),
    )

    [recorded] = containment_evidence(cp.engine, allocation)
    assert recorded["passed"] == (not breaches), recorded
    assert recorded["attempts"] == measured.attempts, recorded
    assert recorded["breaches"] == [a["name"] for a in breaches], recorded
    # The node reaches every stand-in (and the other guest) while the guest is measured.
    assert not measured.control_down(), measured.control
    # Parity's slice_isolation reads the same node's rules and agrees with the guest.
    swept = parity_sweep(
        hostnames=[host.hostname],
        extravars={"slice_parity_checks": ["slice_isolation"]},
        return_state=True,
    )
    [row] = swept.result()
    if containment == "on":
        assert row["failures"] == 0, row
    else:
        assert row["failed checks"] == "slice_isolation", row
    if containment == "off":
        # Without it the guest reaches every stand-in: the matrix can see a breach.
        missed = [a["name"] for a in measured.attempts if not a["reached"]]
        assert not missed, measured.table()
    if breaches:
        raise ContainmentBreached(
            "the slice guest's attempts are not contained: "
            + "; ".join(f"{a['name']} {a['expect']} but {a['result']}" for a in breaches)
            + "\n"
            + measured.table()
        )
