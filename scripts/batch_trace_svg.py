"""Draw docs/img/batch-member-trace.svg from a real run: one member's trace and its batch.

Four requests, each in a span of its own, are batched into one forward of a small MLP with
``weights=(1, 1, 2, 4)``; profkit exports the spans into memory. The picture shows the last
request's trace (its HTTP-like span and the member span profkit put in it, with its share)
and, linked from it, the batch's own trace (the batch span and its regions), on one time axis.

    .venv/bin/python scripts/batch_trace_svg.py [OUT.svg]
"""

from __future__ import annotations

import sys
import time
from html import escape
from pathlib import Path
from typing import Any

import torch
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import profkit
from profkit.testing import capture

OUT = Path(__file__).resolve().parents[1] / "docs" / "img" / "batch-member-trace.svg"
WIDTH, ROW, LEFT = 760, 30, 250


def run() -> list[ReadableSpan]:
    """Four requests through one weighted batch; every finished span."""
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracer = provider.get_tracer("service")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    with capture(sample_every=1, tracer_provider=provider):
        handles = []
        members = []
        for i in range(4):
            span = tracer.start_span(f"POST /generate #{i}")
            handles.append(span)
            with trace.use_span(span):
                members.append(profkit.batch_member())
            time.sleep(0.0005)
        with profkit.batch("decode_step", members, weights=(1, 1, 2, 4)):
            with profkit.region("prepare"):
                x = torch.randn(4, 64)
            with profkit.region("forward"), torch.inference_mode():
                model(x)
        time.sleep(0.0005)
        for span in handles:
            span.end()
    return list(spans.get_finished_spans())


def draw(spans: list[ReadableSpan]) -> str:
    """The SVG: the last request's trace, then the batch's trace it links to."""
    request = next(s for s in spans if s.name == "POST /generate #3")
    assert request.context is not None
    member = next(
        s
        for s in spans
        if s.parent is not None
        and s.parent.span_id == request.context.span_id
        and s.name == "decode_step"
    )
    (link,) = member.links
    batch = next(s for s in spans if s.context and s.context.span_id == link.context.span_id)
    assert batch.context is not None
    regions = sorted(
        (s for s in spans if s.parent and s.parent.span_id == batch.context.span_id),
        key=lambda s: s.start_time or 0,
    )
    rows: list[tuple[ReadableSpan, int, str, str]] = [
        (request, 0, "#9e9e9e", "request span (the service's)"),
        (member, 1, "#ff7043", _member_note(member)),
        (batch, 0, "#5c6bc0", f"batch span: {len(batch.links)} links, size 4"),
        *[(r, 1, "#7986cb", "region") for r in regions],
    ]
    t0 = min(s.start_time or 0 for s, *_ in rows)
    t1 = max(s.end_time or 0 for s, *_ in rows)
    scale = (WIDTH - LEFT - 20) / max(1, t1 - t0)
    height = ROW * (len(rows) + 3) + 20
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
        f'<text x="10" y="18" font-weight="bold">trace {_short(request.context.trace_id)} '
        "(one request)</text>",
    ]
    y = 28
    for i, (span, depth, colour, note) in enumerate(rows):
        if i == 2:
            y += ROW
            out.append(
                f'<text x="10" y="{y - 8}" font-weight="bold">trace '
                f"{_short(batch.context.trace_id)} (the batch, linked)</text>"
            )
        x = LEFT + ((span.start_time or 0) - t0) * scale
        w = max(2.0, ((span.end_time or 0) - (span.start_time or 0)) * scale)
        out.append(f'<text x="{10 + 14 * depth}" y="{y + 15}">{escape(span.name)}</text>')
        out.append(
            f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{ROW - 10}" fill="{colour}"/>'
        )
        out.append(
            f'<text x="{10 + 14 * depth}" y="{y + 27}" fill="#555" font-size="10">'
            f"{escape(note)}</text>"
        )
        y += ROW + 8
    mx = LEFT + ((member.start_time or 0) - t0) * scale
    out.append(
        f'<line x1="{mx:.1f}" y1="{28 + ROW + 8 + ROW - 5}" x2="{mx:.1f}" '
        f'y2="{28 + 3 * ROW + 16}" stroke="#ff7043" stroke-dasharray="4 3"/>'
    )
    out.append(
        f'<text x="{mx + 4:.1f}" y="{28 + 2 * ROW + 26}" fill="#ff7043" font-size="10">'
        "link to the batch span</text>"
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _member_note(member: ReadableSpan) -> str:
    attrs: Any = member.attributes or {}
    return (
        f"member span: profkit.batch.share {attrs['profkit.batch.share']}, "
        f"self cpu {attrs['profkit.self_cpu_us']} µs (scaled)"
    )


def _short(trace_id: int) -> str:
    return f"{trace_id:032x}"[:12] + "…"


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(draw(run()), encoding="utf-8")
    print(out)


if __name__ == "__main__":
    main()
