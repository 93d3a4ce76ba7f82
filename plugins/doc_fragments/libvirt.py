# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    # The option the modules that talk to libvirt share (module_utils/common_args.py).
    DOCUMENTATION = r"""
options:
  libvirt_uri:
    description: libvirt connection URI.
    type: str
    default: qemu:///system
"""
