"""End to end: live capacity in the form, refusal when a pool is full, and bad input never
yields a 500 or a pod (hypothesis over form data and REST JSON)."""

from __future__ import annotations

import re

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fracspawner.backends import load_catalog
from fracspawner.choice.options import OptionsError, resolve_choice
from tests.conftest import DEMO_CATALOG
from tests.e2e_helpers import (
    Browserless,
    demo_topology_with_t4_jobs,
    ensure_group,
    error_on_page,
    pods,
    server_pods,
    spawn,
    stop,
)

pytestmark = pytest.mark.e2e

# Three of the T4's four time-slicing replicas are held by pods that were there before.
TOPOLOGY = demo_topology_with_t4_jobs(3)
CATALOG = yaml.safe_load(DEMO_CATALOG.read_text())


def test_form_shows_live_counts(hub, devcluster):
    ensure_group(hub, "ml-research", "cora")
    html = Browserless(hub, "cora").spawn_form()
    # T4: 1 of 4 replicas free; A100 MIG 1g.10gb: 4 of 4 (two GPUs, all-balanced layout)
    t4 = html.split('data-pool="t4" data-spec="1/4"', 1)[1].split("</span>", 1)[0]
    assert "1 of 4 free" in t4
    mig = html.split('data-pool="a100-mig" data-spec="mig-1g.10gb"', 1)[1].split("</span>", 1)[0]
    assert "4 of 4 free" in mig
    # the quota in the units people think in (GPUs, fractions), tags stripped
    assert "Your GPU quota: 0 of 2 GPUs in use" in " ".join(re.sub(r"<[^>]+>", "", html).split())


def test_last_slot_then_refusal_with_what_is_free(hub, devcluster):
    ensure_group(hub, "ml-research", "cora", "finn")
    status, body = spawn(hub, "cora", {"gpu": "1/4", "pool": "t4"})
    assert status in (201, 202), body
    hub.wait_ready("cora")

    status, body = spawn(hub, "finn", {"gpu": "1/4", "pool": "t4"})
    assert status == 400
    message = body["message"]
    # display names; the same size elsewhere first, then smaller sizes; short
    assert message.startswith(
        "No 1/4 GPU is free on T4 16GB (time-sliced) right now (all 4 are taken). Free instead: "
        "1/4 GPU on H100 80GB (HAMi): "
    ), message
    # then the same share in another unit (20 GiB of 80), then the closest smaller size:
    # MIG 1g.10gb is 1/7 of a GPU, closer to 1/4 than 1/8 is
    assert "; 20 GiB on H100 80GB (HAMi): " in message, message
    assert "; MIG 1g.10gb on A100 80GB (MIG): 4 free; and " in message, message
    assert message.endswith(" more choices on the form."), message  # more what: said
    assert "HTTP" not in message and "t4" not in message
    assert not server_pods(devcluster, "finn")

    # the form says the same, and shows the offer as unavailable with the reason
    browser = Browserless(hub, "finn")
    html = browser.spawn_form()
    t4 = html.split('data-pool="t4" data-spec="1/4"', 1)[1].split("</li>", 1)[0]
    assert "0 of 4 free" in t4 and "None free right now." in t4
    response = browser.submit({"gpu": "1/4", "pool": "t4"})
    # a person's sentence on the form, not "Error: HTTP 400: Bad Request (...)"
    shown = error_on_page(response.text)
    assert shown.startswith("Error: No 1/4 GPU is free on T4 16GB (time-sliced)"), shown
    assert "HTTP 400" not in response.text
    # without a pool, fracspawner picks one that has room: 1/4 is also offered by h100
    status, body = spawn(hub, "finn", {"gpu": "1/4"})
    assert status in (201, 202), body
    hub.wait_ready("finn")
    pod = server_pods(devcluster, "finn")[0]
    assert pod["metadata"]["labels"]["fracspawner.io/pool"] == "h100"
    # the hub's server model says which pool was picked (the culler reads it there)
    assert hub.api("GET", "/users/finn")[1]["servers"][""]["user_options"]["pool"] == "h100"
    stop(hub, "finn", cluster=devcluster)
    stop(hub, "cora", cluster=devcluster)


_catalog = load_catalog(DEMO_CATALOG)
_rule = _catalog.rule_for("hyp", [])
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 10**12),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.sampled_from(
        [
            "1/4",
            "0.3",
            "mig-1g.10gb",
            "10GiB",
            "1",
            "none",
            "h100",
            "t4",
            "a100-mig",
            "pytorch",
            "nope",
            "<script>alert(1)</script>",
            "{{7*7}}",
        ]
    ),
    st.lists(st.text(max_size=5), max_size=2),
    st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2),
)
KEYS = st.sampled_from(
    ["gpu", "pool", "image", "profile", "environment", "cpu_limit", "image--unlisted-choice"]
)


def _invalid(options: dict) -> bool:
    try:
        resolve_choice(_catalog, options, rule=_rule)
    except (OptionsError, TypeError, ValueError):
        return True
    return False


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(options=st.dictionaries(KEYS, VALUES, max_size=3).filter(_invalid))
def test_bad_rest_options_never_500_never_a_pod(hub, devcluster, options):
    status, body = spawn(hub, "hyp", options)
    assert status == 400, (options, status, body)
    assert isinstance(body, dict) and body.get("message")
    assert not server_pods(devcluster, "hyp")


FORM_VALUES = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["1/4", "0.3", "mig-1g.10gb", "1", "h100", "a100-mig", "nope", "<b>x</b>"]),
)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    form=st.dictionaries(
        st.sampled_from(["gpu", "pool", "image", "extra"]), FORM_VALUES, max_size=3
    )
)
def test_bad_form_data_never_500_never_a_pod(hub, devcluster, form):
    options = {k: v.strip() for k, v in form.items() if k in ("gpu", "pool", "image") and v.strip()}
    if not _invalid(options):
        return  # a valid choice would rightly spawn; this property is about bad input
    browser = _form_session(hub)
    response = browser.submit(form)
    assert response.status_code < 500, (form, response.status_code)
    assert error_on_page(response.text), form
    assert not server_pods(devcluster, "formhyp")


_sessions: dict = {}


def _form_session(hub):
    if id(hub) not in _sessions:
        _sessions[id(hub)] = Browserless(hub, "formhyp")
    return _sessions[id(hub)]


def test_preexisting_pods_are_untouched(devcluster):
    names = {p["metadata"]["name"] for p in pods(devcluster)}
    assert {"training-0", "training-1", "training-2"} <= names
