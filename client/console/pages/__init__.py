"""One module per console page; each exposes ``routes(ctx, fragments)``."""
