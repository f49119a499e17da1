"""`gather_generations` (rollout_server/serving/generation.py): a request's one generation runs in the request's own task
(no hand-off through another task's end); several run side by side, their results in prompt order."""

import asyncio

from rollout_server.serving.generation import gather_generations


class GenerationStub:
    """Test double of a Generation: records the task that ran it; finishes once `waits_for` is set (if any),
    then sets its own `done`."""

    def __init__(self, name: str, waits_for: asyncio.Event | None = None):
        self.name = name
        self.waits_for = waits_for
        self.done = asyncio.Event()
        self.task = None

    async def run_to_end(self) -> list[str]:
        self.task = asyncio.current_task()
        if self.waits_for is not None:
            await self.waits_for.wait()
        self.done.set()
        return [self.name]


def test_one_generation_runs_in_the_request_task():
    async def run():
        generation = GenerationStub("a")
        return await gather_generations([generation]), generation.task is asyncio.current_task()

    assert asyncio.run(run()) == ([["a"]], True)


def test_several_generations_run_side_by_side_in_prompt_order():
    async def run():
        second = GenerationStub("second")
        first = GenerationStub("first", waits_for=second.done)  # ends only once the second has: side by side
        return await asyncio.wait_for(gather_generations([first, second]), timeout=5)

    assert asyncio.run(run()) == [["first"], ["second"]]
