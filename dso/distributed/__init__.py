"""One node on several ranks: the process group, FSDP2 shards, sharded inner loop and codec."""
