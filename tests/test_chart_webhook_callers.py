"""Issue 34 item 5: the chart can let only the API server's addresses reach the webhook.

Without a client certificate (clientAuth.caSecret), anyone who reaches the webhook's port may
send it reviews. Where the API server's addresses are known, `networkPolicy.webhookCallers`
narrows the webhook's NetworkPolicy ingress to them (ipBlock peers), plus the metrics scrapers
(the webhook serves /metrics on the same port). The kubelet's probes come from the node, which a
NetworkPolicy always allows ("traffic to and from the node where a Pod is running is always
allowed", kubernetes.io/docs/concepts/services-networking/network-policies/). Off by default.
"""

from __future__ import annotations

from tests.chart_support import objects, one, render

WEBHOOK = {"webhook": {"enabled": True}}


def webhook_ingress(values: dict) -> list[dict]:
    return one(objects(render(values)), "NetworkPolicy", "webhook")["spec"]["ingress"]


def test_by_default_any_peer_may_reach_the_webhook_port():
    (rule,) = webhook_ingress(WEBHOOK)
    assert "from" not in rule and rule["ports"] == [{"port": "https", "protocol": "TCP"}]


def test_given_the_api_servers_addresses_only_they_and_the_scrapers_reach_it():
    values = {
        **WEBHOOK,
        "networkPolicy": {
            "webhookCallers": {
                "cidrs": ["10.0.0.10/32", "10.0.0.11/32"],
                # Konnectivity (GKE, AKS): the API server's calls leave these pods
                "from": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                        },
                        "podSelector": {"matchLabels": {"k8s-app": "konnectivity-agent"}},
                    }
                ],
            }
        },
    }
    rules = webhook_ingress(values)
    assert all(rule.get("from") for rule in rules)  # no rule admits every peer
    callers = rules[0]["from"]
    assert callers[:2] == [
        {"ipBlock": {"cidr": "10.0.0.10/32"}},
        {"ipBlock": {"cidr": "10.0.0.11/32"}},
    ]
    assert callers[2]["podSelector"] == {"matchLabels": {"k8s-app": "konnectivity-agent"}}
    scrapers = rules[1]["from"]
    assert any("operator.prometheus.io/name" in str(peer) for peer in scrapers)
    assert {p["port"] for rule in rules for p in rule["ports"]} == {"https"}
