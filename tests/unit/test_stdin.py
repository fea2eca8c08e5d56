"""An execution's stdin within its bounds: a put that does not fit waits for the command
(or the process's other executions) to take what is held; nothing is lost or left held."""

from __future__ import annotations

import asyncio

import pytest

from controller.executions.stdin import Stdin, StdinBudget


async def waits(put: asyncio.Task[None]) -> bool:
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    return not put.done()


async def test_a_put_past_the_executions_bound_waits_until_bytes_are_sent() -> None:
    stdin = Stdin(StdinBudget(limit=100), limit=10)
    await stdin.put(b"x" * 6)
    second = asyncio.create_task(stdin.put(b"y" * 6))
    assert await waits(second)
    assert await stdin.get() == b"x" * 6
    assert await waits(second)  # taken is not sent: it still counts
    stdin.sent(6)
    await second
    assert stdin.held == 6
    assert await stdin.get() == b"y" * 6


async def test_a_frame_larger_than_the_bound_is_taken_when_nothing_is_held() -> None:
    stdin = Stdin(StdinBudget(limit=100), limit=10)
    await stdin.put(b"z" * 50)
    assert stdin.held == 50


async def test_the_process_bound_holds_back_every_execution() -> None:
    budget = StdinBudget(limit=10)
    first, second = Stdin(budget, limit=10), Stdin(budget, limit=10)
    await first.put(b"a" * 8)
    waiting = asyncio.create_task(second.put(b"b" * 4))
    assert await waits(waiting)
    first.close()  # its execution ended: what it held is let go
    await waiting
    assert (budget.held, first.held, second.held) == (4, 0, 4)


async def test_after_the_end_input_is_dropped_and_a_waiting_put_returns() -> None:
    budget = StdinBudget(limit=10)
    stdin = Stdin(budget, limit=4)
    await stdin.put(b"1234")
    waiting = asyncio.create_task(stdin.put(b"5678"))
    assert await waits(waiting)
    stdin.close()
    await waiting
    await stdin.put(b"later")
    stdin.put_now(None)
    assert budget.held == 0


async def test_the_end_comes_after_the_bytes() -> None:
    stdin = Stdin(StdinBudget())
    stdin.put_now(b"request's own stdin")
    await stdin.put(b"then the client's")
    stdin.put_now(None)
    assert [await stdin.get() for _ in range(3)] == [
        b"request's own stdin",
        b"then the client's",
        None,
    ]


@pytest.mark.parametrize("size", [0, 1])
async def test_nothing_stays_counted(size: int) -> None:
    budget = StdinBudget()
    stdin = Stdin(budget)
    await stdin.put(b"x" * size)
    data = await stdin.get()
    assert data is not None
    stdin.sent(len(data))
    assert budget.held == stdin.held == 0
