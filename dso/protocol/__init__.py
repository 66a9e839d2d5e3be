"""The rules every node shares: windows, commit-reveal, payloads, signatures, rejections, provenance."""
