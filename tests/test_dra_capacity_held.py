"""Issue 34 item 7 (the capacity message): "No 1/8 GPU is free ... (all 8 are taken)" was said
when one claim (a whole GPU) held the pool's only device: the 8 are the eighths that would fit an
empty device, not eighths taken. The DRA count now says how many claims hold the devices, and the
message counts what is held."""

from __future__ import annotations

from decimal import Decimal
from types import SimpleNamespace

import pytest

from fracspawner.backends import load_catalog, plan_slice
from fracspawner.backends.dra import DraBackend
from fracspawner.backends.dra_devices import Capacity, Device, NodeDevices, Policy
from fracspawner.backends.fit import CountedOffer, OfferCapacity, Tally
from fracspawner.choice.options import OptionsError, resolve_choice
from fracspawner.model.catalog import AccessRule
from fracspawner.model.slices import parse_slice

MIB = 1024 * 1024
CATALOG = load_catalog(
    {
        "pools": {
            "l40s": {
                "gpu": "L40S",
                "backend": "dra",
                "options": {"sharing": "shares", "shares": 8},
                "offers": ["1/8", "1/2", "1"],
            }
        }
    }
)
POOL = CATALOG.pools["l40s"]


def shares_device(held: list[dict[str, Decimal]]) -> NodeDevices:
    """One L40S as the driver publishes it with --consumable-shares=8 (consumable_shares.go)."""
    one = Decimal(1)
    device = Device(
        key=("gpu.nvidia.com", "node-1", "gpu-0"),
        node="node-1",
        attributes={"type": "gpu", "productName": "NVIDIA L40S"},
        capacity={
            "shares": Capacity(Decimal(8), Policy(one, one, Decimal(8), one)),
            "memory": Capacity(
                Decimal(46068 * MIB), Policy(Decimal(0), Decimal(0), None, Decimal(MIB))
            ),
        },
        multi=True,
    )
    return NodeDevices(devices=[device], held={device.key: held} if held else {}, counters={})


def counter_for(spec: str):
    offer = parse_slice(spec)
    counter = DraBackend().counter(CountedOffer(POOL, spec, plan_slice(offer, POOL, None)))
    return counter


def test_the_dra_count_says_how_many_claims_hold_the_devices():
    counter = counter_for("1/8")
    whole = {"shares": Decimal(8), "memory": Decimal(0)}
    counter.devices_of = lambda node: shares_device([whole])
    count = counter.count_node(SimpleNamespace(name="node-1"))
    assert (count.free, count.total, count.held) == (0, 8, 1)
    tally = Tally()
    tally.add(count)
    assert counter.result(tally) == OfferCapacity(0, 8, counter.note, held=1)


class FakeCapacity:
    def __init__(self, counts: dict) -> None:
        self.counts = counts

    def get(self, pool: str, spec: str) -> OfferCapacity:
        return self.counts.get((pool, spec), OfferCapacity(None, None))


def test_a_full_pool_held_by_one_claim_says_one_is_held():
    cap = FakeCapacity({("l40s", "1/8"): OfferCapacity(0, 8, "", held=1)})
    with pytest.raises(OptionsError) as info:
        resolve_choice(
            CATALOG, {"gpu": "1/8", "pool": "l40s"}, rule=AccessRule(max_gpu=8), capacity=cap
        )
    message = str(info.value)
    assert "all 8 are taken" not in message
    assert "1 held there takes the room of all 8" in message, message
