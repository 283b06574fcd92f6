"""Server-side rendering of the spawn form from the offer model (works without JavaScript)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from ..model.slices import SliceError, parse_slice


@lru_cache(maxsize=1)
def _env() -> Environment:
    # autoescape: every user- or admin-supplied string (pool names, image names, reasons) is escaped
    return Environment(
        loader=PackageLoader("fracspawner.hub", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _canonical(spec: Any) -> str | None:
    try:
        return str(parse_slice(spec, step=16))
    except SliceError:
        return None


def group_offers(model: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Offers grouped by mode, then by spec across pools: one radio per spec, pools listed."""
    groups: dict[str, dict[str, Any]] = {
        m["id"]: {"id": m["id"], "label": m["label"], "specs": {}} for m in model["modes"]
    }
    for pool in model["pools"]:
        for offer in pool["offers"]:
            group = groups.get(offer["mode"])
            if group is None:  # a mode only offered by pools the user may not use
                continue
            entry = group["specs"].setdefault(
                offer["spec"],
                {
                    "spec": offer["spec"],
                    "label": offer["label"],
                    "display": offer.get("display") or offer["spec"],
                    "pools": [],
                },
            )
            entry["pools"].append({"pool": pool, "offer": offer})
    result = []
    for group in groups.values():
        specs = list(group["specs"].values())
        for entry in specs:
            entry["allowed"] = any(p["offer"]["allowed"] for p in entry["pools"])
        result.append({**group, "specs": specs})
    return result


@lru_cache(maxsize=1)
def picker_assets() -> tuple[str, str]:
    """(css, js) of the picker: packaged under fracspawner/hub/static, or frontend/ in a
    checkout."""
    here = Path(__file__).resolve().parent
    for folder in (here / "static", here.parent.parent / "frontend"):
        if (folder / "picker.js").exists():
            return (folder / "picker.css").read_text(), (folder / "picker.js").read_text()
    return "", ""


def render_form(model: Mapping[str, Any], *, profile_html: str = "", service_url: str = "") -> str:
    previous = model.get("previous") or {}
    selected_gpu = _canonical(previous.get("gpu")) or "none"
    # JSON for the picker script; '<' escaped so no string can close the <script> element, and
    # strict (no NaN/Infinity, which JSON.parse refuses): a bad number is an error here, never
    # a broken page
    model_json = json.dumps(model, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    return (
        _env()
        .get_template("gpu_form.html")
        .render(
            model=model,
            groups=group_offers(model),
            selected_gpu=selected_gpu,
            selected_pool=previous.get("pool") or "",
            selected_image=previous.get("image") or "",
            profile_html=profile_html,
            service_url=service_url,
            model_json=model_json,
            picker_css=picker_assets()[0],
            picker_js=picker_assets()[1],
        )
    )


def render_service_page(model: Mapping[str, Any], *, user: str, hub_prefix: str) -> str:
    """The fracspawner service's root page: the pools and what is free for `user` (escaped)."""
    return (
        _env()
        .get_template("service_page.html")
        .render(model=model, user=user, hub_prefix=hub_prefix)
    )
