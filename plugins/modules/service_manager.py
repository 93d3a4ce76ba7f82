#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: service_manager
short_description: Start, stop, restart or enable a daemon with systemd or, without it, by pidfile
version_added: "0.1.0"
description:
  - Detects the host's service manager the way C(sd_booted) does (C(/run/systemd/system)
    is a directory) instead of being told which one to use.
  - With systemd, the unit is driven through C(systemctl) (O(enabled) enables or disables it).
  - Without systemd (containers, test machines) the daemon is executed directly from
    O(direct.argv) and tracked through O(direct.pidfile). A pid is trusted only when the
    process is alive, is called O(direct.process_name) and lives in the same network
    namespace, so a stale pidfile is never signalled. O(enabled) has no meaning there.
  - The actions are planned from the current state first; check mode reports them and
    changes nothing.
author:
  - gpuaas fleet engineering (@gpuaas)
options:
  name:
    description: Logical service name (also the systemd unit when O(unit) is not given).
    type: str
    required: true
  unit:
    description: systemd unit; default O(name) with C(.service) appended.
    type: str
  state:
    description:
      - V(started) and V(stopped) converge; V(restarted) always restarts; V(reloaded)
        reloads a running daemon (C(systemctl reload) or O(direct.reload_signal)) and starts
        a stopped one.
    type: str
    choices: [started, stopped, restarted, reloaded]
  enabled:
    description: Whether the unit starts at boot (systemd only).
    type: bool
  allow_missing:
    description:
      - Succeed without changes when the unit does not exist (or, without systemd, no
        command is given and nothing runs), for optional services such as host GPU daemons.
    type: bool
    default: false
  daemon_reload:
    description: Run C(systemctl daemon-reload) first (systemd only; not in check mode).
    type: bool
    default: false
  direct:
    description: How to run the daemon when the host has no systemd.
    type: dict
    suboptions:
      argv:
        description: Command that starts the daemon and makes it write O(direct.pidfile).
        type: list
        elements: str
        default: []
      pidfile:
        description: The daemon's pidfile.
        type: path
        required: true
      process_name:
        description: Expected C(/proc/PID/comm) (default the basename of the command).
        type: str
      reload_signal:
        description: Signal for O(state=reloaded).
        type: str
        default: HUP
      start_timeout:
        description: Seconds to wait for a live pid in the pidfile.
        type: float
        default: 20
      stop_timeout:
        description: Seconds between SIGTERM and SIGKILL.
        type: float
        default: 10
      log_path:
        description: File that receives the daemon's stdout and stderr.
        type: path
attributes:
  check_mode:
    description: Reports the planned actions without running them.
    support: full
  diff_mode:
    description: Before and after state.
    support: full
  platform:
    description: Linux hosts, with or without systemd.
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Run dnsmasq with the slice configuration
  gpuaas.fleet.service_manager:
    name: dnsmasq
    state: started
    enabled: true
    direct:
      argv: [dnsmasq, --conf-file=/etc/dnsmasq.d/gpuaas-slice.conf,
             --pid-file=/run/dnsmasq/dnsmasq.pid]
      pidfile: /run/dnsmasq/dnsmasq.pid

- name: Quiesce the host GPU persistence daemon in slice mode
  gpuaas.fleet.service_manager:
    name: nvidia-persistenced
    state: stopped
    enabled: false
    allow_missing: true
    direct:
      pidfile: /run/nvidia-persistenced/nvidia-persistenced.pid
"""

RETURN = r"""
manager:
  description: The detected service manager, V(systemd) or V(direct).
  returned: always
  type: str
name:
  description: The logical service name.
  returned: always
  type: str
unit:
  description: The systemd unit name.
  returned: always
  type: str
present:
  description: Whether the unit exists (systemd) or the daemon can be run or is running.
  returned: always
  type: bool
actions:
  description: Actions run (or planned in check mode), in order.
  returned: always
  type: list
  elements: str
before:
  description: State before (present, active, enabled, pid; more keys with systemd).
  returned: always
  type: dict
after:
  description: State after the actions.
  returned: always
  type: dict
note:
  description: Why O(enabled) was not applied without a service manager.
  returned: when enabled is set on a host without systemd
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuaas.fleet.plugins.module_utils import service_manager
from ansible_collections.gpuaas.fleet.plugins.module_utils.commands import module_runner


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            unit=dict(type="str"),
            state=dict(type="str", choices=list(service_manager.STATES)),
            enabled=dict(type="bool"),
            allow_missing=dict(type="bool", default=False),
            daemon_reload=dict(type="bool", default=False),
            direct=dict(
                type="dict",
                options=dict(
                    argv=dict(type="list", elements="str", default=[]),
                    pidfile=dict(type="path", required=True),
                    process_name=dict(type="str"),
                    reload_signal=dict(type="str", default="HUP"),
                    start_timeout=dict(type="float", default=20.0),
                    stop_timeout=dict(type="float", default=10.0),
                    log_path=dict(type="path"),
                ),
            ),
        ),
        supports_check_mode=True,
    )
    params = module.params
    request = service_manager.Request(
        state=params["state"],
        enabled=params["enabled"],
        allow_missing=params["allow_missing"],
        daemon_reload=params["daemon_reload"],
    )

    runner = module_runner(module)
    try:
        service = service_manager.service_from_params(params)
        result = service_manager.ensure(
            service, request, check_mode=module.check_mode, runner=runner
        )
    except service_manager.ServiceError as exc:
        module.fail_json(msg=str(exc), name=params["name"])
    if module._diff:
        result["diff"] = {"before": result["before"], "after": result["after"]}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
