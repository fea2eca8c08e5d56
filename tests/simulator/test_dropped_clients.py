import asyncio
import logging

from controller.lab.simulator import SimServer


async def test_a_client_dying_mid_body_changes_nothing_and_logs_no_traceback(
    server: SimServer, caplog
) -> None:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    _reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"PUT /v1/var/poolkeeper/claims/x-0123456789ab?cas=0 HTTP/1.1\r\nHost: x\r\n"
        b'Content-Type: application/json\r\nContent-Length: 200\r\n\r\n{"Items": {'
    )
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    await asyncio.sleep(0.2)
    assert server.sim.variables("default") == {}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
