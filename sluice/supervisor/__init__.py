"""The ``sluice serve`` supervisor: one process that loads the model repository, starts
the gateways and model instances the configs ask for, and restarts what dies."""
