"""The wire format: record batches, error codes, framing, API schemas, the client connection."""
