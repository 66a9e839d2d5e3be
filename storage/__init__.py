"""Everything that touches S3: client, object keys, wire format, gather, checkpoints, cleanup, embedded server.

Only this package imports boto3 (and moto, for the embedded server).  See docs/storage.md.
"""
