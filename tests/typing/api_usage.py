"""Type-checked by tests/test_typing.py: decorators keep the wrapped signature; configure()
has typed keyword parameters."""

from __future__ import annotations

from collections.abc import Iterator

import profkit


@profkit.profiled
def add(x: int, y: int = 1) -> int:
    return x + y


@profkit.profiled("named", attributes={"k": "v"})
async def fetch(url: str) -> bytes:
    return url.encode()


@profkit.profiled(name="gen")
def numbers(n: int) -> Iterator[int]:
    yield from range(n)


@profkit.region("stage")
def staged(flag: bool) -> str:
    return str(flag)


reveal_type(add)  # noqa: F821
reveal_type(fetch)  # noqa: F821
reveal_type(numbers)  # noqa: F821
reveal_type(staged)  # noqa: F821
add("not an int")  # expected error: the original signature is enforced
profkit.configure(sample_every=10, exporters=["log"], trace_dir=None)  # fine: typed keywords
profkit.configure(sample_every="10")  # expected error: a setting's type is checked
profkit.configure(sampel_every=10)  # expected error: a misspelt setting is caught


async def batched(members: list[profkit.BatchMember]) -> None:
    """batch() is a sync and an async context manager; weights are numbers."""
    with profkit.batch("forward", members, weights=[1, 2.5]):
        pass
    async with profkit.batch("forward", [*members, profkit.batch_member()]):
        pass
