from __future__ import annotations

import asyncio
import os
import tempfile

import palisade
from palisade import AsyncSandbox


def test_async_fan_out_of_200_runs(client: palisade.Client) -> None:
    async def main() -> list[palisade.RunResult]:
        c = palisade.AsyncClient(f"unix:{client.socket}")
        gate = asyncio.Semaphore(8)
        running = 0
        peak = 0

        async def one(i: int) -> palisade.RunResult:
            nonlocal running, peak
            async with gate:
                running += 1
                peak = max(peak, running)
                try:
                    return await palisade.arun(f"print({i} * 2)", client=c)
                finally:
                    running -= 1

        try:
            rs = await asyncio.gather(*(one(i) for i in range(200)))
        finally:
            await c.aclose()
        assert peak <= 8
        return rs

    rs = asyncio.run(main())
    assert [r.stdout for r in rs] == [f"{i * 2}\n" for i in range(200)]
    assert all(r.status == "ok" for r in rs)


def test_async_sandbox_and_batch(client: palisade.Client) -> None:
    async def main() -> None:
        c = palisade.AsyncClient(f"unix:{client.socket}")
        async with await AsyncSandbox.create(client=c) as sbx:
            assert (await sbx.commands.run("echo hi")).stdout == "hi\n"
            await sbx.files.write("a", "1")
            assert await sbx.files.read("a") == "1"
            with tempfile.TemporaryDirectory() as d:
                assert await sbx.files.download("a", os.path.join(d, "a")) == 1
                assert open(os.path.join(d, "a")).read() == "1"
                assert await sbx.files.download_archive(".", os.path.join(d, "a.tar")) == 512 + 512 + 1024
            assert [e.name for e in await sbx.files.list()] == ["a"]
            await sbx.files.remove("a")
            assert (await sbx.run_code("z = 2\nz ** 10")).text == "1024"
            assert (await sbx.run_code("z")).text == "2"
            h = await sbx.commands.run("echo bg", background=True)
            assert (await h.wait()).stdout == "bg\n"
            got: list[str] = []
            await sbx.commands.run("echo s", on_stdout=got.append)
            assert got == ["s\n"]
        assert sbx.report is not None
        rs = await palisade.arun_batch(["print(1)", "print(2)"], concurrency=2, client=c)
        assert [r.stdout for r in rs] == ["1\n", "2\n"]
        await c.aclose()

    asyncio.run(main())
