# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
name: idle_linear
short_description: Ansible's linear strategy, idle while every fork is busy
description:
  - Runs a play exactly as C(ansible.builtin.linear) does, task by task in lockstep, up to
    the fork limit of hosts at once.
  - When every fork is busy, linear's own wait for a free one polls them every 0.1 ms,
    which keeps the controller's main process busy for as long as the hosts take to answer
    (a run over more hosts than forks, as every fleet sweep batch is). This strategy
    waits in sleeps of 10 ms instead, which delays a host's next task by at most that.
  - A task throttled below the fork limit (C(throttle)) still polls as linear does once a
    fork outside its throttle is free.
version_added: "0.2.0"
author:
  - gpuaas fleet engineering (@gpuaas)
"""

import time

from ansible.plugins.strategy.linear import StrategyModule as LinearStrategyModule

# How long to sleep between looks at the forks while every one is busy.
FORK_WAIT_SECONDS = 0.01


class StrategyModule(LinearStrategyModule):
    def _queue_task(self, host, task, task_vars, play_context):
        while not self._tqm._terminated and all(
            worker is not None and worker.is_alive() for worker in self._workers
        ):
            time.sleep(FORK_WAIT_SECONDS)
        super()._queue_task(host, task, task_vars, play_context)
