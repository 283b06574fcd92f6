"""A FAKE of cuda-python for tests (see bindings/driver.py); not CUDA."""
