"""Prefect flows of the fleet (deployments in prefect.yaml)."""

from flows import refusals

# Runs that end on purpose end in one sentence, in every process that runs a flow.
refusals.install()
