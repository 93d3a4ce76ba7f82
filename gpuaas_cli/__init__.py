"""The ``gpuaas`` operator CLI, above the control plane and the flows: control-plane
commands, the Prefect UI stack (``gpuaas ui``) and, when the lab package is installed,
the demo."""
