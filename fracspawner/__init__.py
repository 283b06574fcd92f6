"""fracspawner: a KubeSpawner for GPU slices (fractions, memory sizes, MIG profiles)."""

from ._version import __version__

__all__ = ["FracSpawner", "__version__"]


def __getattr__(name: str):
    # Import the spawner lazily: `fracspawner plan`, the devcluster and the notebook extension
    # must not pay for importing JupyterHub and kubespawner.
    if name == "FracSpawner":
        from .spawner import FracSpawner

        return FracSpawner
    raise AttributeError(name)
