"""The pure model: slices, GPU models, the catalog and its schema, access rules, errors.

Imports nothing from jupyterhub, kubespawner or kubernetes (a test checks it), so every other
package can build on it and it can be tested with plain values.
"""
