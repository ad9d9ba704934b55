TITLE = (
    "a request for a partition unknown here waits for a ZooKeeper re-read in the background "
    "while later frames of the same connection are applied at once (batch 53 before batch 0)"
)
ORIGIN = "docs/reliability.md review finding 1 (2026-11-24)"
PATCHES = [
    (
        "partition_server/server.py",
        "                if reread:\n"
        "                    await self._refresh_assignment()\n"
        "                reply = self.dispatch(body, conn.guard, refreshed=True)\n"
        "                assert reply is not None\n",
        "                async def _late(\n"
        "                    body: bytes = body, guard: RefusalGuard = conn.guard\n"
        "                ) -> bytes:\n"
        "                    await self._refresh_assignment()\n"
        "                    r = self.dispatch(body, guard, refreshed=True)\n"
        "                    return r if isinstance(r, bytes) else await r  # type: ignore[misc]\n"
        "                # TEETH: the old background re-read\n"
        "                reply = asyncio.ensure_future(_late())\n"
        "                reread = False\n",
    )
]
SEARCH = "sim"
SIM_ARGS: list[str] = []
PYTEST = ""
BUDGET = 1500
WHY_NOT_SIM = ""
