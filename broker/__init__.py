"""Redis: the key schema, the message codec, request and reply routing, model state and
statistics."""
