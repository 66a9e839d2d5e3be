"""A window's training: the miner's inner loop and the network's outer step, in exact arithmetic."""
