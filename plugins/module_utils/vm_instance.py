# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A slice VM's host-side instance: its NoCloud seed, its DHCP reservation and its domain.

The three always change together (docs/slice-host.md, "Provision phases"): a provision
writes the seed and reserves the address the guest's first boot reads, then defines and
starts the domain; a release undefines the domain, then removes the reservation. One
module process does all three (slice_vm_domain's ``seed`` and ``reservation``) because
each module task costs a provision Ansible's worker, connection and interpreter start-up.
Each part still reports as its own phase: its result under its own key, with when it
finished, so the provision role keeps its per-phase timings, and a failure names the part
that failed.
"""

from __future__ import annotations

from ansible_collections.gpuaas.fleet.plugins.module_utils import (
    vm_common,
    vm_dhcp,
    vm_domain,
    vm_seed,
)
from ansible_collections.gpuaas.fleet.plugins.module_utils.vm_common import VmError


def seed_params(params: dict) -> dict:
    return dict(
        params["seed"], allocation_id=params["allocation_id"], mac_address=params["mac_address"]
    )


def reservation_params(params: dict, state: str) -> dict:
    return dict(params["reservation"], mac_address=params["mac_address"], state=state)


def domain_params(params: dict) -> dict:
    """The domain's own parameters; a seed written here is the one it attaches."""
    if params.get("seed"):
        return dict(params, seed_iso=params["seed"]["path"])
    return params


def check_inputs(params: dict) -> None:
    """Every part's input, checked before any part acts: malformed input changes nothing."""
    absent = params["state"] == "absent"
    if not absent and params.get("seed"):
        vm_seed.check_inputs(seed_params(params))
    if params.get("reservation"):
        vm_dhcp.wanted_reservation(reservation_params(params, params["state"]))
    if not absent:
        vm_domain.spec_from_params(domain_params(params))


def run(params: dict, check_mode: bool) -> dict:
    """Module entry of slice_vm_domain: the seed and the reservation (when given) before the
    domain converges to running or defined; the reservation after the domain is gone for
    absent. Every input is checked first; a part that fails stops the rest, and the parts
    that finished are in the failure's details."""
    check_inputs(params)
    parts: dict[str, dict] = {}
    absent = params["state"] == "absent"
    try:
        if not absent and params.get("seed"):
            parts["seed"] = vm_common.run_part(vm_seed.run, seed_params(params), check_mode)
        if not absent and params.get("reservation"):
            parts["reservation"] = vm_common.run_part(
                vm_dhcp.run, reservation_params(params, "present"), check_mode
            )
        domain = vm_domain.run(domain_params(params), check_mode)
        if absent and params.get("reservation"):
            parts["reservation"] = vm_common.run_part(
                vm_dhcp.run, reservation_params(params, "absent"), check_mode
            )
    except VmError as exc:
        exc.details.update(parts)
        raise
    return combine(domain, parts, domain_first=absent)


def combine(domain: dict, parts: dict[str, dict], domain_first: bool) -> dict:
    """The domain's result with each part's under its key: ``changed`` if any of them
    changed, the diff each one's in the order they ran."""
    if not parts:
        return domain
    diffs = [part.pop("diff") for part in parts.values() if "diff" in part]
    if "diff" in domain and domain_first:
        diffs.insert(0, domain["diff"])
    elif "diff" in domain:
        diffs.append(domain["diff"])
    return dict(
        domain,
        **parts,
        changed=domain["changed"] or any(part["changed"] for part in parts.values()),
        diff=diffs,
    )
