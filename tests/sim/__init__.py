"""The deterministic simulator of the acker's guarantees (see :mod:`tests.sim.sim`)."""
