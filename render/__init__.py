"""Launch files rendered from the spec: converter command lines, NxDT configs, environments and
torchrun lines. Pure functions of the spec, so what a runbook step needs can be rendered,
inspected and tested without the hardware."""
