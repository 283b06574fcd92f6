"""Sphinx configuration (MyST markdown, like the other JupyterHub projects' docs)."""

project = "fracspawner"
author = "fracspawner developers"
copyright = "2026, fracspawner developers"

extensions = ["myst_parser"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
html_theme = "pydata_sphinx_theme"
html_static_path = ["_static"]
html_theme_options = {"navigation_with_keys": False}
