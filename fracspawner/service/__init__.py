"""The fracspawner JupyterHub service (live offers for the picker)."""
