"""What a user may choose and what they chose: user_options -> Choice, and the offer model.

Pure and shared by everything that admits a spawn (the hub's spawner and service, the culler's
policy, the Kubeflow webhook); imports no JupyterHub.
"""
