"""Differential privacy of a miner's updates and its accountant."""
