"""Test doubles of an ASGI server's side, shared by the unit tests of streamed responses and disconnects."""

import asyncio


class ClientStub:
    """Test double of the ASGI server's side: records what is sent; `leave()` delivers the disconnect."""

    def __init__(self):
        self.sent: list[dict] = []
        self._left = asyncio.Event()

    async def receive(self) -> dict:
        await self._left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        self.sent.append(message)
        await asyncio.sleep(0)

    def leave(self) -> None:
        self._left.set()

    def bodies(self) -> list[bytes]:
        return [m["body"] for m in self.sent if m["type"] == "http.response.body"]
