"""Everything that runs inside (or beside) JupyterHub: FracSpawner, the form, the service.

The only package that imports jupyterhub and kubespawner; install it with `fracspawner[hub]`.
"""
