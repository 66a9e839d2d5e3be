"""Compressed updates: the codec seam, DeMo's DCT top-k codec, the sketch codec and their encodings."""
