"""Experiments around the core: miner behaviours and the adversarial miner, the local network, the in-process
simulator, run reports and synthetic attacks.

The one-way rule (docs/architecture.md): this package may import dso, storage, scoring and neurons; none of
them may import it.  tests/unit/test_architecture.py checks it."""
