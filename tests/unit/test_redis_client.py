"""The Redis client's protocol half (RESP2), pure: commands encoded, replies parsed whole
however the bytes arrive, declared sizes bounded before anything is allocated; and its
connection half against a real redis-server."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from nursery.runtime.redis_client import (
    INCOMPLETE,
    MAX_BULK,
    Connection,
    Pool,
    RedisError,
    ReplyError,
    ReplyReader,
    encode_command,
)
from nursery.scheduling.cache_store import RedisOptions
from tests.cloud_servers import redis_server
from tests.conftest import free_port


def test_command_encoding() -> None:
    assert encode_command(b"HSET", "k", 5, b"\r\n") == (
        b"*4\r\n$4\r\nHSET\r\n$1\r\nk\r\n$1\r\n5\r\n$2\r\n\r\n\r\n")


REPLIES = [
    (b"+OK\r\n", b"OK"),
    (b":42\r\n", 42),
    (b"$-1\r\n", None),
    (b"*-1\r\n", None),
    (b"$0\r\n\r\n", b""),
    (b"$5\r\nab\r\nc\r\n", b"ab\r\nc"),
    (b"*3\r\n$1\r\na\r\n:-7\r\n*1\r\n+x\r\n", [b"a", -7, [b"x"]]),
    (b"*0\r\n", []),
]


@given(st.lists(st.sampled_from(REPLIES), min_size=1, max_size=6), st.data())
def test_replies_parse_whole_however_they_are_split(replies: list[tuple[bytes, object]],
                                                     data: st.DataObject) -> None:
    wire = b"".join(r[0] for r in replies)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=8)))
    reader = ReplyReader()
    got: list[object] = []
    start = 0
    for cut in [*cuts, len(wire)]:
        reader.feed(wire[start:cut])
        start = cut
        while (reply := reader.next()) is not INCOMPLETE:
            got.append(reply)
    assert got == [r[1] for r in replies]


def test_error_reply_is_a_value_with_the_servers_words() -> None:
    reader = ReplyReader()
    reader.feed(b"-WRONGPASS invalid username-password pair or user is disabled.\r\n")
    reply = reader.next()
    assert isinstance(reply, ReplyError)
    assert str(reply) == "WRONGPASS invalid username-password pair or user is disabled."


@pytest.mark.parametrize("wire", [b"$%d\r\n" % (MAX_BULK + 1), b"*99999999999\r\n",
                                  b"?what\r\n", b":x\r\n", b"$3\r\nabcXY", b"+" + b"a" * 70000])
def test_hostile_replies_fail_without_allocating(wire: bytes) -> None:
    reader = ReplyReader()
    reader.feed(wire)
    with pytest.raises(RedisError):
        reader.next()


def _options(port: int, **kw: object) -> RedisOptions:
    return RedisOptions(host="127.0.0.1", port=port, **kw)  # type: ignore[arg-type]


async def test_connection_and_pool_against_a_real_redis(tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis", password="pw") as port:
        with pytest.raises(ReplyError, match="NOAUTH Authentication required"):
            await Connection.open(_options(port))
        with pytest.raises(ReplyError, match="WRONGPASS"):
            await Connection.open(_options(port, password="nope"))
        pool = Pool(_options(port, password="pw", pool_size=2, db=3))
        await pool.start()
        try:
            assert await pool.call(b"HSET", b"k", b"a", b"1", b"b", b"\x00\xff") == 2
            assert await pool.call(b"HGETALL", b"k") == [b"a", b"1", b"b", b"\x00\xff"]
            assert await pool.call(b"HGETALL", b"missing") == []
            async with trio.open_nursery() as n:  # more callers than connections: they wait
                for i in range(6):
                    n.start_soon(pool.call, b"SET", f"s{i}", i)
            assert await pool.call(b"GET", b"s5") == b"5"
            with pytest.raises(ReplyError, match="WRONGTYPE"):  # an error reply: no harm
                await pool.call(b"GET", b"k")
            assert await pool.call(b"PING") == b"PONG"
        finally:
            await pool.aclose()


async def test_connect_failures_say_where_and_why() -> None:
    port = free_port()  # nothing listens there
    with pytest.raises(RedisError, match=rf"failed to connect to Redis \(127.0.0.1:{port}\): "
                                         "Connection refused"):
        await Connection.open(_options(port))
    with pytest.raises(RedisError, match="failed to connect to Redis .*(Name or service not "
                                         "known|Temporary failure in name resolution)"):
        await Connection.open(RedisOptions(host="no-such-host.invalid", port=6379))


async def test_a_redis_that_never_answers_costs_the_timeouts_not_a_hang() -> None:
    from tests.cloud_servers import silent_server

    with silent_server() as port:
        with pytest.raises(RedisError, match="did not answer within 200 ms"):
            await Connection.open(_options(port, socket_timeout=200))


async def test_callers_wait_for_a_free_connection_at_most_wait_timeout(tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis") as port:
        pool = Pool(_options(port, pool_size=1, wait_timeout=100))
        await pool.start()
        try:
            async with trio.open_nursery() as n:
                n.start_soon(pool.call, b"BLPOP", b"never", b"1")  # holds the one connection
                await trio.sleep(0.05)
                with pytest.raises(RedisError, match="no connection to Redis free within 100"):
                    await pool.call(b"PING")
            assert await pool.call(b"PING") == b"PONG"  # free again once BLPOP timed out
        finally:
            await pool.aclose()
