"""Review s56 of the endpoints' authentication, authorisation and input handling: each test
here failed before its fix (the commit that added it says how)."""

from __future__ import annotations

import json

import pytest

from tests.test_culler_hostile import receiver, report  # noqa: F401  (the fixture)


# --- the culler's report port: a null where a list's object belongs is a 400, never a 500 ----
@pytest.mark.parametrize(
    ("raw", "field_named"),
    [
        ('"culled_kernels": [null]', "culled_kernels[0]"),
        ('"kernels": [null]', "kernels[0]"),
        ('"swap": {"hibernate_wanted": [null]}', "swap.hibernate_wanted[0]"),
        ('"hibernation": {"hibernations": [null]}', "hibernation.hibernations[0]"),
        ('"hibernation": {"resumes": [null]}', "hibernation.resumes[0]"),
        ('"gpu_unknown_reasons": [null]', "gpu_unknown_reasons[0]"),
    ],
)
async def test_a_null_list_item_in_a_report_is_a_400_naming_it(receiver, raw, field_named):  # noqa: F811
    body = json.dumps(report()).encode()[:-1] + b", " + raw.encode() + b"}"
    code, answer, _ = await receiver.post(body)
    assert code == 400 and field_named in answer["message"], (code, answer)


# --- the server extension: POST gpu/resume with a body that is no JSON object ---------------
@pytest.fixture(scope="module")
def jupyter(tmp_path_factory):
    from tests.test_culler_support import JupyterServer

    tmp = tmp_path_factory.mktemp("jupyter")
    gpu_file = tmp / "gpu.json"
    gpu_file.write_text("{}")
    server = JupyterServer(tmp, gpu_file)
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("body", [[1], "x", 1, True])
def test_resume_with_a_body_that_is_no_object_is_a_400(jupyter, body):
    status, answer = jupyter.api("POST", "/api/fracspawner/gpu/resume", body)
    assert status == 400, (status, answer)
    assert "JSON object" in answer["message"]
    assert jupyter.api("POST", "/api/fracspawner/gpu/resume", {})[0] == 200
