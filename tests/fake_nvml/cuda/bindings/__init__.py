"""A FAKE of cuda-python's cuda.bindings, for tests only."""
