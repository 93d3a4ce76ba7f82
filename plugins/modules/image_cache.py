#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: image_cache
short_description: Fetch a slice image into the node's image cache, verified while it streams
version_added: "0.1.0"
description:
  - Makes O(dest) hold the catalog image whose sha256 is O(sha256). A file already there
    with that digest is left alone; otherwise the image is fetched from O(url) (the
    registry blob URL the control plane resolved) into a temporary file next to O(dest),
    hashed as it arrives, and renamed to O(dest) only when the digest matches.
  - A digest mismatch, a short transfer or a registry that goes away mid-way fails the
    task and leaves O(dest) as it was (a previously verified copy stays); no partial file
    is left under any name.
  - With O(state=verified) nothing is fetched; the cached file is hashed and the task fails
    when it is missing or differs (the control plane's periodic re-verification).
author:
  - gpuaas fleet engineering (@gpuaas)
options:
  dest:
    description: The image's path in the node cache.
    type: path
    required: true
  sha256:
    description: Catalog digest of the image (hex, optionally C(sha256:) prefixed).
    type: str
    required: true
  url:
    description: HTTP(S) URL of the image blob; needed when the cache does not hold it.
    type: str
  state:
    description: C(present) fetches when needed; C(verified) only checks the cached file.
    type: str
    choices: [present, verified]
    default: present
  headers:
    description: Request headers, such as the registry's C(Authorization) bearer token.
    type: dict
  timeout:
    description: Seconds to wait for the registry to answer or send more data.
    type: int
    default: 60
  validate_certs:
    description: Verify the registry's TLS certificate.
    type: bool
    default: true
  ca_path:
    description: CA bundle for the registry's certificate.
    type: path
attributes:
  check_mode:
    description: Hashes the cached file and reports whether a fetch would happen.
    support: full
  diff_mode:
    description: The change is the digest, reported in RV(previous_sha256) and RV(sha256).
    support: none
"""

EXAMPLES = r"""
- name: Prewarm the slice image
  gpuaas.fleet.image_cache:
    dest: /var/lib/gpuaas/slice-images/ubuntu-24.04-h200-cuda.raw
    sha256: "{{ image_sha256 }}"
    url: "https://registry.example/v2/slices/ubuntu/blobs/sha256:{{ image_sha256 }}"
    headers:
      Authorization: "Bearer {{ registry_token }}"

- name: Re-verify the cached image
  gpuaas.fleet.image_cache:
    dest: /var/lib/gpuaas/slice-images/ubuntu-24.04-h200-cuda.raw
    sha256: "{{ image_sha256 }}"
    state: verified
"""

RETURN = r"""
path:
  description: The image's path in the cache.
  returned: always
  type: str
sha256:
  description: The catalog digest the cached file now has (or would have, in check mode).
  returned: always
  type: str
previous_sha256:
  description: The cached file's digest before the task; null when there was none.
  returned: always
  type: str
status:
  description: C(verified) when the cache holds the image; before a fetch, C(missing) or
    C(stale) (another digest) in check mode.
  returned: always
  type: str
fetched:
  description: Whether the image was transferred.
  returned: always
  type: bool
bytes:
  description: Bytes transferred.
  returned: when fetched
  type: int
seconds:
  description: Wall time of the transfer and its verification.
  returned: when fetched
  type: float
throughput_mib_s:
  description: Transfer throughput in MiB/s.
  returned: when fetched
  type: float
code:
  description: Why the task failed (C(digest_mismatch), C(transfer_truncated),
    C(transfer_failed), C(cache_missing), C(cache_stale), C(invalid_digest),
    C(url_required)).
  returned: failure
  type: str
kept:
  description: On a failed fetch, whether a previous cached file was left in place.
  returned: failure of a fetch
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuaas.fleet.plugins.module_utils import image_cache


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dest=dict(type="path", required=True),
            sha256=dict(type="str", required=True),
            url=dict(type="str"),
            state=dict(type="str", choices=["present", "verified"], default="present"),
            headers=dict(type="dict", no_log=True),
            timeout=dict(type="int", default=60),
            validate_certs=dict(type="bool", default=True),
            ca_path=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    try:
        result = image_cache.run(module.params, module.check_mode)
    except image_cache.CacheError as exc:
        module.fail_json(msg=str(exc), code=exc.code, **exc.details)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
