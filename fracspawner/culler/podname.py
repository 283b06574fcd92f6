"""The pod name KubeSpawner gives a server, so GPU metrics labelled by pod can be matched to it.

Uses kubespawner's own slug functions (kubespawner/slugs.py) so names match exactly, for both
slug schemes: 'safe' (kubespawner >= 7 default) and 'escape' (the older one). Mirrors
KubeSpawner._expand_user_properties for the fields a pod name template can use without a
spawner object; the default template is kubespawner 7's `jupyter-{user_server}`.
"""

from __future__ import annotations

import functools

from kubespawner.slugs import escape_slug, multi_slug, safe_slug

DEFAULT_TEMPLATE = "jupyter-{user_server}"
_MAX = 48  # kubespawner's per-field slug budget


@functools.lru_cache(maxsize=4096)  # pure; called for each server on each report
def pod_name(
    username: str, servername: str = "", template: str = DEFAULT_TEMPLATE, scheme: str = "safe"
) -> str:
    safe_server = safe_slug(servername, max_length=_MAX) if servername else ""
    safe_user = safe_slug(username, max_length=_MAX)
    if len(safe_user) + len(safe_server) + 2 > _MAX:
        safe_user_server = multi_slug([username, servername], max_length=_MAX)
    elif servername:
        safe_user_server = f"{safe_user}--{safe_server}"
    else:
        safe_user_server = safe_user
    esc_user, esc_server = escape_slug(username), escape_slug(servername)
    esc_user_server = f"{esc_user}--{esc_server}" if servername else esc_user
    if scheme == "safe":
        names = (safe_user, safe_server, safe_user_server)
    elif scheme == "escape":
        names = (esc_user, esc_server, esc_user_server)
    else:
        raise ValueError(f"slug scheme must be 'safe' or 'escape', not {scheme!r}")
    rendered = template.format(
        username=names[0],
        servername=names[1],
        user_server=names[2],
        unescaped_username=username,
        unescaped_servername=servername,
        safe_username=safe_user,
        safe_servername=safe_server,
        safe_user_server=safe_user_server,
        escaped_username=esc_user,
        escaped_servername=esc_server,
        escaped_user_server=f"{esc_user}--{esc_server}",
    )
    # as kubespawner: drop the '-' a template like 'jupyter-{username}--{servername}' leaves
    return rendered if template.endswith("-") else rendered.rstrip("-")
