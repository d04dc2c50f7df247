"""``--driver asyncio-minimal``: an open-loop client written small, to check another
asyncio client's figures against: plain asyncio (no uvloop), IPROTO over asyncio streams
(no client library), and no pool of tasks taking requests: one scheduler coroutine sleeps
until each request's intended time and writes it, one reader coroutine matches the
answers to their requests by sync.  At most ``concurrency`` requests are in flight.

It sends insert, select, update and delete (the operations every driver has) and reports
through the same recorders as the other drivers, so its table reads like theirs.
"""
import asyncio
import base64
import collections
import hashlib
import time

import msgpack

from bench.core.openloop import OpenPhase, OpenRecorder
from bench.core.recorder import Recorder
from bench.core.workloads import DUPLICATE_KEY, ER_TUPLE_FOUND, SERVER_ERROR, Payloads, check

OPERATIONS = ("insert", "select", "update", "delete")
# IPROTO: request codes, header and body keys (Tarantool's box/iproto_constants.h).
CODES = {"select": 1, "insert": 2, "update": 4, "delete": 5}
AUTH = 7
CODE, SYNC = 0x00, 0x01
SPACE_ID, INDEX_ID, LIMIT, OFFSET, ITERATOR, KEY, TUPLE = 0x10, 0x11, 0x12, 0x13, 0x14, 0x20, 0x21
USER_NAME = 0x23
DATA, ERROR = 0x30, 0x31
VSPACE, VSPACE_NAME_INDEX = 281, 2
UPDATE_OPS = [("+", 1, 1)]
LIMIT_ALL = 0xFFFFFFFF


class ServerError(Exception):
    """An error response: ``code`` is the server's error code."""

    def __init__(self, code, message):
        super().__init__("%s (code %d)" % (message, code))
        self.code = code


def scramble(salt, password):
    """chap-sha1: sha1(password) xor sha1(salt[:20] + sha1(sha1(password)))."""
    step1 = hashlib.sha1(password.encode()).digest()
    step2 = hashlib.sha1(step1).digest()
    step3 = hashlib.sha1(salt[:20] + step2).digest()
    return bytes(a ^ b for a, b in zip(step1, step3))


class Connection:
    """One IPROTO connection over asyncio streams: ``await request(code, body)`` returns
    the rows, or raises :class:`ServerError`, or ``ConnectionError`` when closed."""

    def __init__(self):
        self.reader = self.writer = None
        self.sync = 0
        self.waiting = {}
        self.reading = None

    async def connect(self, host, port, user=None, password=None):
        self.reader, self.writer = await asyncio.open_connection(host, port)
        greeting = await self.reader.readexactly(128)
        self.reading = asyncio.ensure_future(self._read())
        if user:
            salt = base64.b64decode(greeting[64:108].strip())
            await self.request(AUTH, {USER_NAME: user,
                                      TUPLE: ["chap-sha1", scramble(salt, password or "")]})

    def send(self, code, body):
        """Write a request now; returns the future of its rows."""
        self.sync += 1
        future = asyncio.get_running_loop().create_future()
        self.waiting[self.sync] = future
        payload = msgpack.packb({CODE: code, SYNC: self.sync}) + msgpack.packb(body)
        self.writer.write(b"\xce" + len(payload).to_bytes(4, "big") + payload)
        return future

    async def request(self, code, body):
        return await self.send(code, body)

    async def _read(self):
        """Each answer: a msgpack uint32 length, then the header and the body."""
        try:
            while True:
                size = await self.reader.readexactly(5)
                unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
                unpacker.feed(await self.reader.readexactly(int.from_bytes(size[1:], "big")))
                header = unpacker.unpack()
                self._answer(header, unpacker.unpack())
        except (ConnectionError, OSError, asyncio.IncompleteReadError) as exc:
            self._fail(exc)

    def _answer(self, header, body):
        future = self.waiting.pop(header.get(SYNC), None)
        if future is None or future.done():
            return
        code = header.get(CODE, 0)
        if code & 0x8000:
            future.set_exception(ServerError(code & 0x7FFF, body.get(ERROR, "error")))
        else:
            future.set_result(body.get(DATA, []))

    def _fail(self, exc):
        waiting, self.waiting = self.waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(ConnectionError(str(exc)))

    async def close(self):
        if self.writer is not None:
            self.writer.close()
        if self.reading is not None:
            self.reading.cancel()
            try:
                await self.reading
            except asyncio.CancelledError:
                pass


class MinimalDriver:
    """The worker's driver interface (``bench.drivers.clients``) over :class:`Connection`."""

    recorder_class = Recorder
    open_recorder_class = OpenRecorder

    def __init__(self, config, host, port):
        self.config = config
        self.host, self.port = host, port
        self.concurrency = config.concurrency
        self.payloads = Payloads(config.size, config.seed)
        self.requests = collections.Counter()

    def open(self):
        self.loop = asyncio.new_event_loop()
        self.conn = Connection()
        self.loop.run_until_complete(self.conn.connect(
            self.host, self.port, self.config.user, self.config.password))
        rows = self.loop.run_until_complete(self.conn.request(CODES["select"], {
            SPACE_ID: VSPACE, INDEX_ID: VSPACE_NAME_INDEX, LIMIT: 1, OFFSET: 0,
            ITERATOR: 0, KEY: [self.config.space]}))
        if not rows:
            raise RuntimeError("no space %r on the server" % self.config.space)
        self.space_id = rows[0][0]

    def body(self, op, key):
        space = self.space_id
        if op == "insert":
            return {SPACE_ID: space, TUPLE: [key, 0, self.payloads(key)]}
        if op == "select":
            return {SPACE_ID: space, INDEX_ID: 0, LIMIT: LIMIT_ALL, OFFSET: 0, ITERATOR: 0,
                    KEY: [key]}
        if op == "update":
            return {SPACE_ID: space, INDEX_ID: 0, KEY: [key], TUPLE: UPDATE_OPS}
        return {SPACE_ID: space, INDEX_ID: 0, KEY: [key]}

    def run(self, phase, recorder, started=None):
        self.loop.run_until_complete(self._run(phase, recorder, started))

    async def _run(self, phase, recorder, started):
        """The scheduler: each request written at its intended time (a closed loop's
        as soon as a slot is free), its answer recorded by a callback."""
        is_open = isinstance(phase, OpenPhase)
        window = getattr(getattr(phase, "phase", phase), "window", None)
        slots = asyncio.Semaphore(self.concurrency)
        clock, send, body = time.monotonic, self.conn.send, self.body
        pending = set()

        def answered(future, op, key, intended, t0):
            t1 = clock()
            slots.release()
            pending.discard(future)
            exc = future.exception()
            if exc is not None:
                error = kind_of(exc)
            else:
                rows = future.result()
                error = check(op, key, rows, self.payloads)
                if op == "insert" and window is not None:
                    window.ack(key)
            if is_open:
                recorder.record_open(op, intended, t0, t1, error)
            else:
                recorder.record(op, t0, t1, error)

        if started is not None:
            started()
        while True:
            item = phase.take()
            if item is None:
                break
            op, key = item[0], item[1]
            if op not in CODES:
                raise ValueError("asyncio-minimal sends %s only, not %s"
                                 % (", ".join(OPERATIONS), op))
            intended = item[2] if is_open else None
            if is_open:
                wait = intended - clock()
                if wait > 0:
                    await asyncio.sleep(wait)
            await slots.acquire()
            t0 = clock()
            future = send(CODES[op], body(op, key))
            pending.add(future)
            future.add_done_callback(
                lambda f, op=op, key=key, intended=intended, t0=t0:
                answered(f, op, key, intended, t0))
        if pending:
            await asyncio.wait(list(pending))

    def counters(self):
        return None

    def close(self):
        self.loop.run_until_complete(self.conn.close())
        self.loop.close()


def kind_of(exc):
    """The kind an error is counted as, as the other drivers count it."""
    if isinstance(exc, ServerError):
        return DUPLICATE_KEY if exc.code == ER_TUPLE_FOUND else "%s_%d" % (SERVER_ERROR, exc.code)
    return type(exc).__name__
