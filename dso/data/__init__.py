"""Training data: the corpus and its tokeniser, shards on disk or in a bucket, and each peer's assignment."""
