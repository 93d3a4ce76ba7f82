"""gpuaas control plane: intent, placement and evidence for a fleet of GPU hosts."""
