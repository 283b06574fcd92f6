"""Review s56 of the Helm chart (charts/fracspawner), on the manifests Helm's own code renders
(helm-python-sdk, tests/chart_support.render).

- The hub asks the culler for room on over-committed pools at `culler_url` + `api/room`, the
  culler's report port (NOTES's culler_url): the culler's NetworkPolicy must admit the hub's
  pods there, not only the user pods that push reports.
"""

from __future__ import annotations

import re

from tests.chart_support import objects, one, render


# ------------------------------------------------------------------ the hub reaches api/room
def test_the_hub_may_reach_the_culler_where_it_asks_for_room():
    """FracSpawner.culler_room_url defaults to culler_url + "api/room" (hub/spawner.py), and
    the culler serves api/room on its report port next to api/reports (culler/app.py). The
    hub's request comes from the hub pod; before, the culler's ingress admitted only the
    singleuser pods to that port, so every room question timed out and over-committed pools
    were admitted by slot counts alone ("no answer: admitted as before")."""
    rendered = render({})
    notes = rendered["fracspawner/templates/NOTES.txt"]
    (url,) = re.findall(r'c\.FracSpawner\.culler_url = "([^"]+)"', notes)
    objs = objects(rendered)
    culler = one(objs, "Deployment", "culler")["spec"]["template"]["spec"]["containers"][0]
    port_name = next(
        p["name"] for p in culler["ports"] if url.rstrip("/").endswith(f":{p['containerPort']}")
    )
    assert port_name == "reports"
    policy = one(objs, "NetworkPolicy", "culler")
    admitted = [
        peer["podSelector"]["matchLabels"]
        for rule in policy["spec"]["ingress"]
        if "reports" in {p["port"] for p in rule["ports"]}
        for peer in rule["from"]
    ]
    assert {"app": "jupyterhub", "component": "hub"} in admitted
    assert {"app": "jupyterhub", "component": "singleuser-server"} in admitted
    # user pods still reach no other port of the culler (metrics, /api/state there)
    for rule in policy["spec"]["ingress"]:
        if {p["port"] for p in rule["ports"]} != {"reports"}:
            assert {"app": "jupyterhub", "component": "singleuser-server"} not in [
                peer.get("podSelector", {}).get("matchLabels") for peer in rule["from"]
            ]
