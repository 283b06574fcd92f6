"""The real-GPU suite (`make test-gpu`): skipped without an NVIDIA GPU and driver."""
