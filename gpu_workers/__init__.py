"""The model instance process: load a model, take micro-batches off its Redis stream, run
them, answer."""
