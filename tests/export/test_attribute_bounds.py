"""User attributes are bounded by type as well as size: every one reaches the OTLP wire.

An int outside int64 fails the OTLP encoder for every span of a batch (issue #26): it
leaves profkit as its decimal string. Floats (nan and inf too), bools and strings pass.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

import profkit
import profkit.testing

INT64_MAX = 2**63 - 1


def _wire_attributes(spans: Any) -> dict[str, dict[str, Any]]:
    """Each span's attributes as the real OTLP encoder writes them, by span name."""
    request = encode_spans(spans)
    out: dict[str, dict[str, Any]] = {}
    for resource in request.resource_spans:
        for scope in resource.scope_spans:
            for span in scope.spans:
                attrs: dict[str, Any] = {}
                for kv in span.attributes:
                    kind = kv.value.WhichOneof("value")
                    attrs[kv.key] = getattr(kv.value, kind) if kind else None
                out[span.name] = attrs
    return out


@profkit.profiled(
    "x",
    attributes={
        "big": 2**70,
        "neg": -(2**64),
        "edge": INT64_MAX,
        "over": INT64_MAX + 1,
        "low": -(2**63),
        "ok": 5,
        "flag": True,
        "nan": math.nan,
        "inf": -math.inf,
        "text": "hi",
    },
)
def profiled_call() -> int:
    with profkit.region("inner", huge=10**30, small=3, items=[1, 2**80]):
        return 1


def test_every_attribute_reaches_the_wire() -> None:
    with profkit.testing.capture(sample_every=1) as cap:
        assert profiled_call() == 1
    assert cap.stats is not None
    assert cap.stats["exported"] == 1
    wire = _wire_attributes(cap.spans())
    root, inner = wire["x"], wire["inner"]
    assert root["big"] == "1180591620717411303424"
    assert root["neg"] == str(-(2**64))
    assert root["over"] == str(2**63)
    assert root["edge"] == INT64_MAX
    assert root["low"] == -(2**63)
    assert root["ok"] == 5
    assert root["flag"] is True
    assert math.isnan(root["nan"])
    assert root["inf"] == -math.inf
    assert root["text"] == "hi"
    assert inner["huge"] == str(10**30)
    assert inner["small"] == 3
    assert inner["items"] == str([1, 2**80])


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 2**200])
def test_out_of_int64_becomes_its_string(value: int) -> None:
    from profkit._summary.builder import _bounded_attrs

    assert _bounded_attrs({"k": value}, 64, 10) == {"k": str(value)}
    # and the string is bounded like any other
    assert len(_bounded_attrs({"k": 10**200}, 16, 10)["k"]) == 16  # type: ignore[arg-type]


class Unprintable:
    """An attribute value whose str() and repr() raise (a lazy proxy, a closed handle)."""

    def __str__(self) -> str:
        raise RuntimeError("str boom")

    def __repr__(self) -> str:
        raise RuntimeError("repr boom")


def test_an_attribute_whose_str_raises_costs_that_attribute_only() -> None:
    @profkit.profiled("weird", attributes={"w": Unprintable(), "ok": 1})
    def weird() -> int:
        with profkit.region("inner", w=Unprintable()):
            return 7

    with profkit.testing.capture(sample_every=1) as cap:
        assert 7 == weird()
        assert profkit.force_flush(10.0)
    stats = cap.stats
    assert (1, 0) == (stats["exported"], stats["dropped"]), stats["dropped_reasons"]
    spans = {s.name: dict(s.attributes or {}) for s in cap.spans()}
    assert "<Unprintable>" == spans["weird"]["w"]
    assert 1 == spans["weird"]["ok"]
    assert "<Unprintable>" == spans["inner"]["w"]
