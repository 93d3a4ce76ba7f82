"""A SKU's per-vNIC rates: what a slice VM's management vNIC is shaped to.

The same shape and units as libvirt's ``<bandwidth>``: ``inbound`` (what the VM receives)
and ``outbound`` (what it sends), each with ``average`` and optionally ``peak`` in
kilobytes per second and ``burst`` in kilobytes (docs/slice-host.md, "Per-vNIC QoS"). The
node plane checks the same rules again before it builds a domain; this is the store's
check, so a SKU never holds rates no node would accept.
"""

from __future__ import annotations

from typing import Any

from controlplane.errors import InvalidInput

DIRECTIONS = ("inbound", "outbound")
KEYS = ("average", "peak", "burst")
# Above 100 Gbit/s or a 1 GiB burst a rate is a typo, not a policy.
MAX_RATE_KBPS = 12_500_000
MAX_BURST_KB = 1_048_576


def _refuse(message: str, given: Any) -> InvalidInput:
    return InvalidInput("vnic_bandwidth_invalid", message, {"vnic_bandwidth": given})


def validate(raw: Any) -> dict[str, dict[str, int]] | None:
    """The rates, normalized (directions and keys not given left out, an inbound peak not
    given set to the average, as the node sets it), or None for an unshaped vNIC;
    InvalidInput for anything a node would refuse."""
    if not raw:
        return None
    if not isinstance(raw, dict):
        raise _refuse(f"vNIC bandwidth must be an object, not {raw!r}", raw)
    unknown = sorted(set(raw) - set(DIRECTIONS))
    if unknown:
        raise _refuse(f"vNIC bandwidth directions are inbound and outbound, not {unknown}", raw)
    rates: dict[str, dict[str, int]] = {}
    for direction in DIRECTIONS:
        given = {k: v for k, v in (raw.get(direction) or {}).items() if v is not None}
        if not given:
            continue
        if set(given) - set(KEYS) or "average" not in given:
            raise _refuse(f"{direction} needs average (and optionally peak, burst): {given}", raw)
        checked: dict[str, int] = {}
        for key in KEYS:
            if key not in given:
                continue
            value = given[key]
            limit = MAX_BURST_KB if key == "burst" else MAX_RATE_KBPS
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= limit:
                unit = "kilobytes" if key == "burst" else "kilobytes per second"
                raise _refuse(
                    f"{direction} {key} {value!r} must be a whole number of {unit} "
                    f"from 1 to {limit}",
                    raw,
                )
            checked[key] = value
        if checked.get("peak", checked["average"]) < checked["average"]:
            raise _refuse(
                f"{direction} peak {checked['peak']} is below its average {checked['average']}",
                raw,
            )
        if direction == "inbound" and "peak" not in checked:
            # An average is a cap on either bridge; libvirt gives an Open vSwitch port the
            # average as its minimum and caps only at the peak (docs/slice-host.md).
            checked = {"average": checked["average"], "peak": checked["average"], **checked}
        rates[direction] = checked
    return rates or None
