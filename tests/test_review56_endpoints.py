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
