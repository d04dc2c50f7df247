"""Framing and transport: one socket, one writer greenlet, one reader greenlet.

A caller registers its greenlet under its sync id, appends its request (the
header framed here, the body already encoded) to the write buffer and waits.
The writer greenlet sends everything queued since its last flush in one call;
the reader greenlet receives large chunks into one buffer, cuts them into
frames, decodes each reply (an OK one straight into its response object; an
error's body is left for ``protocol.make_response``) and queues it for the
greenlet with that sync id (``request``'s common case and ``_cut``'s loop run
in C, ``gtarantool._speedups``, when the package was built with a compiler; the
C loop leaves the OK replies of a read past its 64th for their callers to
decode, so that the cyclic GC does not find hundreds of them waiting).
The hub wakes the first greenlet of the queue; each woken caller takes its
reply from the queue and, when it waits for its next one, wakes the next caller
itself: one greenlet switch per request instead of two through the hub.  What
the callers of such a batch queue is sent by the hub once they all wait again
(``flush``, one write), not by the writer, which takes only what the socket
does not accept at once and what other callers queue; a batch of more than
``FLUSH_EVERY`` callers sends that many at a time, so that the server starts
on the first while the rest still queue theirs; in a batch of at most
``LEAD_UP_TO`` callers woken with nothing of theirs at the server, the first
sends its request itself, for the same reason.

A lone request skips both helpers' wake-ups: a caller that finds no other
request in flight, nothing queued for the writer and no other caller about to
run (whose request would join its batch) sends its frame itself, in one
non-blocking ``writev``; and a receive that brings exactly one reply, for a
caller with no other reply queued, is handed on by the read watcher's callback
in the hub, which switches straight to that caller (the reader greenlet is
resumed only when there is more to do). Under load the queue is never empty,
and the writer still sends each burst in one call.

On any failure (socket error, EOF, garbage) the transport closes itself and
fails every waiter at once; it never reconnects or re-sends: that is the
connection's decision.

Used in a process forked after it was opened (however forked: see
``process_token``), a transport gives the parent's socket up before it reads
or writes a byte: a request raises ``InheritedSocket`` before it is sent or
registered, and the transport fails as for a lost connection, closing only
this process's copy of the descriptor (no shutdown, no write).
"""
import collections
import errno
import os
import socket
import sys
from typing import TYPE_CHECKING

import msgpack
from gevent import Greenlet, Timeout, getcurrent
from gevent.event import Event
from gevent.exceptions import InvalidSwitchError
from gevent.hub import Waiter, get_hub
from tarantool.error import NetworkError

from gtarantool import compiled
from gtarantool.errors import ConnectionClosed, CopiedCall, ProtocolError, not_sent
from gtarantool.protocol.codec import BodyDecoder, decode_or_error
from gtarantool.protocol.constants import (
    IPROTO_CHUNK,
    IPROTO_EVENT,
    REQUEST_TYPE_ERROR,
)
from gtarantool.protocol.frames import (
    parse_header,
    reply_header,
    request_header,
    slow_prefix,
)
from gtarantool.protocol.responses import Response, ok_response

RECV_SIZE = 256 * 1024
# A piece of the write buffer this large (a batch of whole requests from
# send_frames) is written alone, not copied into one piece with the rest.
LARGE_PIECE = 64 * 1024
# A batch whose long values are written from the rows (encode_batch(...,
# gather=N), in C): written alone by its own writev, never joined.
_Gather = compiled.encoder.Gather if compiled.encoder is not None else None
_RawReply = compiled.speedups.RawReply if compiled.speedups is not None else None
# Requests that a batch of woken callers sends at a time: one write at the end
# of a batch of 1,000 would leave the server idle while they all ran.
FLUSH_EVERY = 128
# A batch of at most this many woken callers with none of their requests at
# the server: the first request goes out at once, so that the server works on
# it while the rest run (see "The write path" in docs/design.rst).
LEAD_UP_TO = 32

class InheritedSocket(ConnectionClosed):
    """The transport was opened by the parent of this forked process: nothing of
    the request was sent (``Transport.request`` raises it before), or, for a
    request the parent sent before the fork, its reply goes to the parent (the
    copy of its caller in this process did nothing here: ``applied`` False)."""

    applied = False


class Draining(ConnectionClosed):
    """The server announced its shutdown while the caller waited in line for
    ``max_in_flight``: nothing was sent on this socket, the connection sends
    the request on the next one."""

    applied = False


def check_process(token):
    """Raise ``CopiedCall`` when this is not the process ``token`` (a
    ``process_token()``) was taken in."""
    if token != process_token():
        raise CopiedCall("this call was made by the parent of this forked process, and goes "
                         "on there: nothing of it is sent here")


def process_token():
    """Differs in every process forked since it was taken, and is cheap to take:
    with ``gtarantool._speedups``, a count that its ``pthread_atfork`` handler
    bumps in every child (os.fork, multiprocessing, or a fork made from C
    without Python's hooks, as uWSGI's); without it, ``os.getpid()``, a system
    call, which is why the Python paths take it only once per request and
    beside the reader's and writer's own system calls."""
    return _token()


# Chosen once, at import: a count of forks and a pid never compare, so every
# token of the process comes from the one source (a test that turns the
# compiled paths off for a while does not turn a connection made before into
# a forked child's).
_token = compiled.speedups.fork_generation if compiled.speedups is not None else os.getpid


class Stats:
    """Per-connection counters, cumulative over reconnects.

    ``send_calls`` counts the writer's flushes (one ``sendall`` each) and the
    callers' own sends (a lone request's, one ``writev``), ``recv_calls`` the
    reader's reads; ``responses`` counts every frame received, pushes included;
    ``discarded`` counts late replies to requests whose caller gave up.
    """

    __slots__ = ("requests", "responses", "send_calls", "recv_calls", "bytes_out",
                 "bytes_in", "max_in_flight", "reconnects", "schema_reloads", "discarded")
    requests: int
    responses: int
    send_calls: int
    recv_calls: int
    bytes_out: int
    bytes_in: int
    max_in_flight: int
    reconnects: int
    schema_reloads: int
    discarded: int

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self) -> "dict[str, int]":
        """:returns: every counter by name."""
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self):
        return "Stats(%s)" % ", ".join("%s=%d" % kv for kv in self.as_dict().items())


class TransportState:
    """What a transport shares with its C paths: the Python twin of
    ``_speedups.TransportCore`` (see the top of ``_speedups.c``), whose fields
    are the same names as members of the C object, and whose ``request`` is
    the C method's specification.  ``Transport`` derives from the C type when
    the package was built with a compiler, from this class otherwise: the
    choice is made once, here, at import.  The C ``request`` takes the common
    case and hands every other call to ``request_general``, this ``request``.

    ``HOOKS`` names the methods of ``Transport`` that the C paths call for
    what they hand back (the same names as ``_speedups.TRANSPORT_HOOKS``):
    ``request_general(sync, code, schema_version, body)``, a request the C
    path does not take; ``forget(sync, greenlet)``, a caller interrupted
    while it waited; ``switched_early(sync, greenlet)``, a caller switched to
    before its reply came; ``after_send(header, body, sent)``, a caller's own
    send that the socket did not take whole (``sent`` bytes, or the OSError);
    ``flush_early()``, every ``FLUSH_EVERY`` queued requests;
    ``after_lone_receive(received, taken)``, a lone receive that was not one
    whole reply; ``hand_on(more)``, after the read watcher's receive; and
    ``flush()``, to send what the caller the read watcher woke has queued.
    """

    HOOKS = ("request_general", "forget", "switched_early", "after_send", "flush_early",
             "after_lone_receive", "hand_on", "flush")

    __slots__ = ("_pending", "_ready", "_wbuf", "_queue", "_hub", "_reader", "_rbuf", "stats",
                 "_fd", "_rlen", "_waking", "_flush_due", "max_response_size", "_requester")

    def request(self, sync, code, schema_version, body):
        """Send request ``code`` with its encoded ``body`` and wait for its reply
        (returned; see the class).  With ``code`` None, ``body`` is a whole frame
        already.  A timeout or kill while waiting discards the reply."""
        if self._process != self._token():
            raise self._inherited()
        pending = self._pending
        if len(pending) >= self.max_in_flight or self.error is not None:
            self._wait_for_room()
        if code is None:
            header, body = body, b""
        else:
            header = request_header(code, sync, schema_version, len(body))
        alone = not pending
        current = getcurrent()
        pending[sync] = current   # only once nothing above can raise
        buf = self._wbuf
        ready = self._ready
        if alone and not buf and (not ready or len(ready) < LEAD_UP_TO):
            # No other request in flight or queued (the writer keeps its batch
            # in buf while it sends) and no caller about to run: no batch to
            # wait for; or a few callers about to run: this one leads their
            # batch.  (Callers that start together queue behind the first.)
            try:
                self._send_now(header, body)
            except BaseException:   # (it fails the transport on socket errors instead)
                del pending[sync]
                raise
        else:
            if not buf and not self._flush_due:
                self._wakeup.set()
            buf += (header, body)   # two entries per request: the writer counts len(buf) // 2
            if len(buf) % (2 * FLUSH_EVERY) == 0:
                try:
                    self.flush_early()
                except BaseException:   # queued: its reply, if it comes, is discarded
                    self.forget(sync, current)
                    raise
        try:
            if ready and current is not self._hub:
                # Wake the next caller whose reply is in; it takes the reply
                # from _ready itself.  (Passed in the switch, the reply would
                # stay referenced from this frame until this greenlet runs
                # again, and a response refers to its connection.)
                ready[0][0].switch()
            else:
                self._hub.switch()
        except BaseException:
            self.forget(sync, current)
            raise
        # (The process checked again: a copy in a forked child may wake with
        # a reply the parent read before the fork; it is the parent's.)
        if ready and ready[0][0] is current and self._process == self._token():
            value = ready.popleft()[1]
            if type(value) is _RawReply:   # (the C reader's: see _speedups.c)
                return self._cutter.finish(value)
            return value
        self.switched_early(sync, current)


if TYPE_CHECKING:   # (the checker reads the twin: the C module's stub is untyped)
    _State = TransportState
else:
    _State = compiled.speedups.TransportCore if compiled.speedups is not None else TransportState


class Transport(_State):
    """A connected socket with its reader and writer greenlets.

    ``request(sync, code, schema_version, body)`` sends a request and returns
    its reply: for an OK reply whose body is a map, and without push messages
    (nearly every reply), its ``protocol.Response`` with ``conn`` None (the
    caller sets it); otherwise ``(sync, code, schema version, body, pushes)``,
    or the exception that failed the connection.  ``body`` is the decoded
    body, or the exception decoding it raised (that request fails, the
    connection stays up), or an error reply's undecoded bytes; ``pushes`` is
    None or a list of ``(code, schema version, body)``.  (Nothing in a reply
    refers to the connection: the greenlet that switches with it holds it until
    it runs again, and must not keep a dropped connection alive.)
    ``send_many`` queues many requests whose replies go to one ``ReplySink``
    (a pipeline's) instead.  ``close()`` kills and joins both greenlets.
    """

    __slots__ = ("_sock", "_token", "_process", "_pid", "_decoder", "max_in_flight", "error",
                 "_abandoned", "_wakeup", "_sending", "_read_watcher", "_write_watcher",
                 "_rview", "_need", "_cutter", "on_event", "on_fail", "_writer", "draining",
                 "_gathers", "__weakref__")

    # The Python request, for what the C one hands back (see TransportState).
    request_general = TransportState.request

    def __init__(self, sock, stats, max_in_flight, max_response_size, name="tarantool",
                 decoder=None):
        self._sock = sock
        self._token = _token              # process_token's, without its call
        self._process = self._token()      # see _inherited
        self._pid = os.getpid()
        self.stats = stats
        self._decoder = decoder or BodyDecoder()
        self.max_in_flight = max_in_flight
        self.max_response_size = max_response_size
        self.error = None                 # set once: why the transport died
        self.draining = False             # an announced shutdown: no new request (drain())
        self._hub = get_hub()
        self._pending = {}                # sync -> waiting greenlet, ReplySink or _Pushes
        self._ready = collections.deque()  # (greenlet, reply) to wake, in order
        self._waking = False              # _run_ready is scheduled or running
        # Callers are being woken, and whoever woke them sends what they queue
        # once they all wait again (flush): they need not wake the writer.
        self._flush_due = False
        self._abandoned = set()           # syncs whose caller gave up (timeout, kill)
        self._wbuf = []                   # frames to send, two pieces per request
        self._gathers = 0                 # Gathers queued in _wbuf, at most (see _take)
        self._wakeup = Event()            # the writer's: something to send
        self._sending = False             # the writer is sending the front of _wbuf
        self._fd = sock.fileno()          # callers' own sends and the reader use it directly
        self._read_watcher = None         # the reader's, while it runs
        self._write_watcher = None        # the writer's, once the socket was full
        self._queue = collections.deque()  # Waiters of callers beyond max_in_flight, in order
        # The reader receives into one reused buffer (a fresh large bytes object
        # per read costs page faults); an incomplete frame is kept at its front.
        self._rbuf = bytearray(RECV_SIZE)
        self._rview = memoryview(self._rbuf)
        self._rlen = 0                    # bytes of an incomplete frame at the front
        self._need = 0                    # bytes there must be before parsing again
        self._cutter = None               # _cut's common frames in C, when built
        speedups = compiled.speedups
        if speedups is not None and self._decoder.options is not None:
            self._cutter = speedups.ReplyCutter(self._pending, self._ready, msgpack.unpackb,
                                                 self._decoder.options, Response, ReplySink,
                                                 _Pushes)
        self.on_event = None              # IPROTO_EVENT frames go here: on_event(sync, body bytes)
        self.on_fail = None               # called with the error once the transport dies
        self._requester = None            # request()'s common case in C, when built
        if speedups is not None:
            self._requester = speedups.Requester(self, Transport.request_general,
                                                  self._wakeup.set, getcurrent, max_in_flight,
                                                  FLUSH_EVERY, self._cutter, LEAD_UP_TO)
        self._reader = Greenlet(self._read_loop)
        self._writer = Greenlet(self._write_loop)
        self._reader.name = "%s-reader" % name
        self._writer.name = "%s-writer" % name
        self._reader.start()
        self._writer.start()

    @property
    def alive(self):
        return self.error is None

    @property
    def in_flight(self):
        return len(self._pending)

    # -- the caller's side ---------------------------------------------------

    def _send_now(self, header, body):
        """Send one request from its caller's greenlet, without blocking."""
        try:
            sent = os.writev(self._fd, (header, body))
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            sent = exc
        self.after_send(header, body, sent)

    def after_send(self, header, body, sent):
        """After a caller's own send of ``sent`` bytes (or the OSError it raised):
        what the socket did not take goes to the writer, ahead of anything
        queued later; a failure fails the transport (and so the caller,
        registered already)."""
        if type(sent) is not int:
            self._fail(_network_error(sent, "write"))
            return
        stats = self.stats
        if sent:
            stats.send_calls += 1
            stats.bytes_out += sent
        if sent == len(header) + len(body):
            stats.requests += 1
            if len(self._pending) > stats.max_in_flight:
                stats.max_in_flight = len(self._pending)
            return
        self._wbuf += ((header + body)[sent:], b"")
        self._wakeup.set()

    def switched_early(self, sync, waiting):
        """Something switched to ``waiting`` before its reply came, or ``waiting``
        is a copy in a forked child of a caller of the parent's: give up on it."""
        self.forget(sync, waiting)
        if self._process != self._token():
            raise CopiedCall("this call was made by the parent of this forked process, and goes "
                             "on there: its reply is the parent's")
        raise InvalidSwitchError("%r was switched to while it waited for the reply to "
                                 "request %d, which has not come" % (waiting, sync))

    def post(self, frame):
        """Queue a whole frame that gets no reply (IPROTO_WATCH, IPROTO_UNWATCH)."""
        if self.error is not None:
            raise self.error
        if not self._wbuf:
            self._wakeup.set()
        self._wbuf += (frame, b"")

    def send_many(self, requests, syncs, sink, stream_id=0):
        """Queue ``requests`` ((code, body) pairs, sent with schema version 0)
        under ``syncs`` (one each, in order), their replies going to ``sink``,
        and add each sync to ``sink.syncs`` as it is queued.  Waits for room in
        ``max_in_flight`` as ``send`` does; what an exception leaves unsent is
        not queued and not in ``sink.syncs``.  ``stream_id``: the stream the
        requests go in (0: none)."""
        if self._process != self._token():
            raise self._inherited()
        pending = self._pending
        buf = self._wbuf
        start, total = 0, len(requests)
        while start < total:
            if len(pending) >= self.max_in_flight or self.error is not None:
                self._wait_for_room()
            stop = min(total, start + self.max_in_flight - len(pending))
            if not buf:
                self._wakeup.set()
            sink.outstanding += stop - start
            sink.syncs += syncs[start:stop]
            for (code, body), sync in zip(requests[start:stop], syncs[start:stop]):
                pending[sync] = sink
                buf += (request_header(code, sync, 0, len(body), stream_id), body)
            start = stop

    def send_detached(self, code, body, sync, stream_id=0):
        """Queue one request whose reply nobody awaits (it is discarded when it
        comes), when this transport is this process's, alive, not draining and
        has room now: it never waits.  Returns whether it was queued."""
        if (self._process != self._token() or self.error is not None or self.draining
                or len(self._pending) >= self.max_in_flight):
            return False
        self.send_many([(code, body)], [sync], ReplySink(), stream_id)
        return True

    def send_frames(self, frames, first_sync, count, sink):
        """Queue ``frames``, ``count`` whole requests encoded already (by
        ``Encoder.encode_batch``) with the syncs ``first_sync`` ..
        ``first_sync + count - 1``, their replies going to ``sink`` as
        ``send_many``'s do (``sink`` may be a checking sink: then they are
        its owner's, their successes stored as ``CHECKED``): the syncs are
        registered and the bytes queued in one step, after waiting for room
        in ``max_in_flight`` as a single request does (the batch then takes
        its ``count`` slots at once).
        Raises, nothing queued and nothing in ``sink.syncs``, as ``send_many``
        does: ``InheritedSocket`` in a process forked since the transport
        opened, the transport's error when it died."""
        if self._process != self._token():
            raise self._inherited()
        pending = self._pending
        if len(pending) >= self.max_in_flight or self.error is not None:
            self._wait_for_room()
        registered = dict.fromkeys(range(first_sync, first_sync + count), sink)
        pending.update(registered)
        owner = sink if sink.owner is None else sink.owner
        owner.syncs += registered   # (the same int objects as pending's keys)
        owner.outstanding += count
        buf = self._wbuf
        if not buf:
            self._wakeup.set()
        buf += (frames, b"")
        if type(frames) is _Gather:
            self._gathers += 1
        self.stats.requests += count - 1   # (the writer counts the pair as one)

    def _wait_for_room(self):
        """Wait in line while ``max_in_flight`` requests await replies.  Raises,
        the request unsent (``applied`` False), when the transport died, is
        being drained (``Draining``: the caller goes to the next socket), or
        the process forked while the caller waited (a copy of the parent's
        caller, which goes on there: an error, never a cue to send it here)."""
        join = self._queue.append
        while self.error is None and not self.draining \
                and len(self._pending) >= self.max_in_flight:
            waiter = Waiter(self._hub)
            join(waiter)
            # Let in, and another caller took the slot first: wait at the front.
            join = self._queue.appendleft
            try:
                waiter.get()
            except BaseException as exc:  # timed out or killed while in line
                try:
                    self._queue.remove(waiter)
                except ValueError:
                    self._pass_on()  # it was let in already: the slot goes to the next
                if isinstance(exc, Timeout):
                    exc.unsent = True   # (read by Connection: a timeout before the write)
                raise
            if self._process != self._token():
                raise CopiedCall("this call was made by the parent of this forked process, "
                                 "and goes on there: nothing of it is sent here")
        if type(self.error) is InheritedSocket:
            raise CopiedCall(str(self.error))
        if self.error is not None:
            raise not_sent(self.error)
        if self.draining:
            raise Draining("the server announced its shutdown: this socket takes no new "
                           "request")

    def drain(self):
        """Take no new request (an announced shutdown): the callers in line for
        ``max_in_flight`` leave it with ``Draining``; those in flight get their
        replies."""
        self.draining = True
        if self._queue:
            wake = [(waiter, None) for waiter in self._queue]
            self._queue.clear()
            self._hub.loop.run_callback(_wake_all, wake)

    def _let_in(self, wake):
        """Hand the slots that came free to the callers waiting in line."""
        free = self.max_in_flight - len(self._pending)
        queue = self._queue
        while free > 0 and queue:
            wake.append((queue.popleft(), None))
            free -= 1

    def _pass_on(self):
        if self._queue:
            wake = []
            self._let_in(wake)
            self._hub.loop.run_callback(_wake_all, wake)

    def abandon(self, sync):
        """The caller stopped waiting (timeout, kill): discard its reply when it comes."""
        if self._pending.pop(sync, None) is not None and self.error is None:
            self._abandoned.add(sync)
            self._pass_on()

    def forget(self, sync, waiting):
        """``abandon(sync)`` for the greenlet ``waiting``, whose reply may be
        queued to wake it already: that wake-up must not reach it later, while
        it waits for something else."""
        if sync in self._pending:
            self.abandon(sync)
            return
        ready = self._ready
        for index, (glet, _) in enumerate(ready):
            if glet is waiting:
                del ready[index]
                return

    def _wake(self, wake, lone=False):
        """Wake the callers in ``_ready`` and hand each ``(waiter, value)`` of
        ``wake`` (those that must be switched from the hub) to its waiter.
        ``lone``: the read watcher's callback switches to a single caller in
        ``_ready`` itself, unless callers in line for ``max_in_flight`` were let
        in: they go first."""
        if wake:
            self._hub.loop.run_callback(_wake_all, wake)
        if self._ready and not self._waking and (wake or not lone or len(self._ready) > 1):
            self._waking = self._flush_due = True
            self._hub.loop.run_callback(self._run_ready)

    def _run_ready(self):
        """In the hub: switch to the first caller in ``_ready``; callers wake
        the rest as they wait again, and the hub takes over whenever one
        waits for something else."""
        ready = self._ready
        while ready:
            waiting = ready[0][0]
            try:
                waiting.switch()
            except BaseException:  # as gevent's Waiter: a greenlet that died raising
                self._hub.handle_error(waiting, *sys.exc_info())
            if ready and ready[0][0] is waiting:
                ready.popleft()   # it did not take its reply (it was dead): never retry it
        self._waking = self._flush_due = False
        self.flush()

    def flush_early(self):
        """Every ``FLUSH_EVERY`` requests queued: send them now (see the module),
        unless the writer has a backlog (the socket was full): that would be
        copied again for every ``FLUSH_EVERY`` requests."""
        if not self._wakeup.is_set():
            self.flush()

    def flush(self):
        """After a batch of woken callers (in the hub; or every ``FLUSH_EVERY``
        of their requests): send what they queued now, in one non-blocking
        write, instead of waking the writer (which takes what the socket does
        not, and anything while it is sending)."""
        buf = self._wbuf
        if not buf or self._sending:
            return
        if self._process != self._token():
            self._inherited()
            return
        data, queued = self._take()
        size = len(data)
        try:
            sent = data.write(self._fd) if type(data) is _Gather else os.write(self._fd, data)
        except BlockingIOError:
            sent = 0
        except OSError:   # the writer meets it again and fails the transport
            sent = 0
        stats = self.stats
        if len(self._pending) > stats.max_in_flight:
            stats.max_in_flight = len(self._pending)
        if sent:
            stats.send_calls += 1
            stats.bytes_out += sent
        if sent == size:
            stats.requests += queued // 2
            del buf[:queued]
            if buf:   # (what was queued behind a large piece)
                self._wakeup.set()
            return
        # The rest as one piece, ahead of anything queued later; the writer
        # counts it as one request.  (A view, not a copy, of a large one; a
        # Gather goes on from where it stopped.)
        stats.requests += queued // 2 - 1
        if type(data) is _Gather:
            rest = data
        else:
            rest = memoryview(data)[sent:] if size - sent >= LARGE_PIECE else data[sent:]
        buf[:queued] = (rest, b"")
        self._wakeup.set()

    # -- the writer greenlet -------------------------------------------------

    def _write_loop(self):
        buf = self._wbuf
        wakeup = self._wakeup
        stats = self.stats
        try:
            while True:
                wakeup.wait()
                wakeup.clear()
                while buf:
                    data, queued = self._take()
                    stats.requests += queued // 2
                    in_flight = len(self._pending)   # the most there are: all sent, none answered
                    if in_flight > stats.max_in_flight:
                        stats.max_in_flight = in_flight
                    size = len(data)
                    # Left in buf until sent: a caller that finds buf empty sends
                    # itself, and must not do so in the middle of this batch,
                    # nor flush.
                    self._sending = True
                    self._send_all(data)
                    self._sending = False
                    del buf[:queued]
                    stats.send_calls += 1
                    stats.bytes_out += size
                    data = None   # (not held while asleep: a sender may reuse its buffer)
        except Exception as exc:  # noqa: BLE001 - any failure kills the transport
            self._fail(_network_error(exc, "write"), killer=self._writer)

    def _take(self):
        """``(data, entries)``: what to write next from the front of the write
        buffer and how many of its entries that is.  A large piece or a Gather
        alone; else the pieces up to the first Gather, joined.  (``_gathers``
        counts the Gathers queued, or more: the buffer is searched only when
        there may be one, and the count is reset when there is none.)"""
        buf = self._wbuf
        first = buf[0]
        if not buf[1] and (type(first) is _Gather or len(first) >= LARGE_PIECE):
            return first, 2
        queued = len(buf)
        if self._gathers:
            for k in range(2, queued, 2):
                if type(buf[k]) is _Gather:
                    return _joined(buf, k), k
            self._gathers = 0
        return _joined(buf, queued), queued

    def _send_all(self, data):
        """The writer's blocking send: sock.sendall's loop, which looks at the
        process again after every wait (the writer may be waiting for room
        when the process forks).  A Gather writes from where it stopped."""
        gather = type(data) is _Gather
        view = data if gather else memoryview(data)
        while True:
            if self._process != self._token():
                raise self._inherited()
            try:
                sent = view.write(self._fd) if gather else os.write(self._fd, view)
            except BlockingIOError:
                sent = 0
            if gather:
                if not len(view):
                    return
            elif sent == len(view):
                return
            else:
                view = view[sent:]
            if self._write_watcher is None:
                self._write_watcher = self._hub.loop.io(self._fd, 2)
            self._hub.wait(self._write_watcher)

    # -- the reader greenlet -------------------------------------------------

    def _read_loop(self):
        # The read watcher stays on for the transport's life; its callback,
        # _readable, runs in the hub and resumes this greenlet only when there
        # is more to do than hand one reply to its caller.
        watcher = self._read_watcher = self._hub.loop.io(self._fd, 1)
        if self._cutter is not None:
            watcher.start(compiled.speedups.LoneReader(self, Transport._readable, self._cutter))
        else:
            watcher.start(self._readable)
        switch = self._hub.switch
        try:
            while True:
                exc = switch()   # parked until _readable resumes it
                if exc is not None:
                    raise exc
                while self._read():
                    pass
        except Exception as exc:  # noqa: BLE001 - any failure kills the transport
            self._fail(_network_error(exc, "read"), killer=self._reader)
        finally:
            watcher.stop()

    def _read(self, lone=False):
        """One receive into the read buffer, its replies handed on (``lone``:
        see ``_wake``).  True when the reader should read again at once (see
        ``_read_again``)."""
        start = self._rlen
        space = len(self._rbuf) - start
        try:
            received = os.readv(self._fd, (self._rview[start:],))
        except BlockingIOError:
            return False
        if not received:
            raise _lost("the server closed the connection")
        stats = self.stats
        stats.recv_calls += 1
        stats.bytes_in += received
        self._parse(start + received, lone)
        return self._read_again(received == space)

    def _read_lone(self):
        """``_read(lone=True)`` with nothing buffered, queued or being woken (a
        lone request's reply, most likely): a receive that is one whole reply
        is taken in one step (in C when built), anything else parsed as usual."""
        if self._cutter is not None:
            got = self._cutter.receive_lone(self._fd, self._rbuf, self.max_response_size)
        else:
            got = self._receive_lone()
        if got is None:
            return False
        return self.after_lone_receive(*got)

    def after_lone_receive(self, received, taken):
        """The rest of ``_read_lone`` after its receive of ``received`` bytes."""
        if not received:
            raise _lost("the server closed the connection")
        stats = self.stats
        stats.recv_calls += 1
        stats.bytes_in += received
        if taken:
            stats.responses += 1
            return False
        self._parse(received, True)
        return self._read_again(received == len(self._rbuf))

    def _read_again(self, filled):
        """After a receive: read again at once when it filled the buffer, or
        when callers are being woken while other replies are due (those that
        come meanwhile join the batch, whose requests go out in one write).
        With nothing in flight the receive could only fail: at 10 greenlets
        that was one system call and two reader switches per batch."""
        return filled or bool(self._pending) and (len(self._ready) != 1 or self._waking)

    def _receive_lone(self):
        """One receive into the empty read buffer: ``(bytes received, taken)``,
        taken when they are exactly one whole reply for a caller's greenlet,
        queued in ``_ready`` for it as ``_cut`` queues it (an OK reply as a
        response with its ``_size``); None when there was nothing to read.
        (The cutter's ``receive_lone`` in C.)"""
        try:
            received = os.readv(self._fd, (self._rview,))
        except BlockingIOError:
            return None
        header = reply_header(self._rbuf, 0, received, self.max_response_size)
        if header is None or header[1] != received or header[2] == IPROTO_CHUNK:
            return received, False
        waiter = self._pending.get(header[3])
        if waiter is None or type(waiter) is ReplySink or type(waiter) is _Pushes:
            return received, False
        self._cut(self._rbuf, received, [])   # (as the cutter's loop takes it)
        self.stats.responses -= 1   # _read_lone counts it, as for the C path
        return received, True

    def _readable(self):
        """The read watcher's callback, in the hub.  A receive that brings one
        reply for a caller with no other reply queued (a lone request's)
        switches from here straight to that caller, which sends its next
        request and waits in the hub again: the reader greenlet is not woken.
        Anything else (more replies, part of a frame, an error) resumes the
        reader, which reads on or fails the transport.  (``_speedups.LoneReader``
        in C, when built, for a lone request's reply.)"""
        if self._process != self._token():   # before any receive: the parent's replies
            self._inherited()
            return
        try:
            if self._rlen or self._ready or self._waking or self._queue:
                more = self._read(lone=True)
            else:
                more = self._read_lone()
        except BaseException as exc:   # raised in the reader, which owns failures
            self._reader.switch(exc)
            return
        self.hand_on(more)

    def hand_on(self, more):
        """After the read watcher's receive: resume the reader when it should
        read ``more``, or switch to the one caller whose reply is in."""
        if more:
            self._reader.switch(None)
            return
        ready = self._ready
        if len(ready) == 1 and not self._waking:
            waiting = ready[0][0]
            self._flush_due = True
            try:
                waiting.switch()
            except BaseException:   # as gevent's Waiter: a greenlet that died raising
                self._hub.handle_error(waiting, *sys.exc_info())
            self._flush_due = False
            if ready and ready[0][0] is waiting:
                ready.popleft()   # it did not take its reply (it was dead)
            if self._wbuf:
                self.flush()

    def feed(self, data):
        """Cut ``data`` (any piece of the stream) into frames and hand each reply
        to its waiter (the reader receives into the same buffer itself)."""
        end = self._rlen + len(data)
        if end > len(self._rbuf):
            self._resize(end)
        self._rview[self._rlen:end] = data
        self._parse(end)

    def _parse(self, end, lone=False):
        """Hand on every whole frame in the first ``end`` bytes of the read
        buffer and move the rest to its front (``lone``: see ``_wake``)."""
        if end >= self._need:
            wake = []
            try:
                pos = self._cut(self._rbuf, end, wake)
            except BaseException:
                # Even when a later frame is bad, the replies already taken out
                # of the pending table must reach their callers.
                self._wake(wake)
                raise
            self._wake(wake, lone)
            if pos:
                end -= pos
                self._rview[:end] = self._rview[pos:pos + end]
        self._rlen = end
        size = len(self._rbuf)
        if end == size:   # one incomplete frame fills it: grow as its bytes arrive
            self._resize(2 * size)
        elif size > RECV_SIZE and end <= RECV_SIZE // 2:
            self._resize(RECV_SIZE)

    def _resize(self, size):
        buf = bytearray(max(size, RECV_SIZE))
        buf[:self._rlen] = self._rview[:self._rlen]
        self._rbuf, self._rview = buf, memoryview(buf)

    def _cut(self, data, end, wake):
        """Queue the reply in every whole frame of ``data[:end]`` for its caller
        (in ``_ready``, or in ``wake`` for the hub to hand over); return where
        the rest starts."""
        first, first_ready = len(wake), len(self._ready)
        stored = 0   # replies the C cutter put in a ReplySink: not in wake
        # The C cutter decodes bodies as msgpack.unpackb with the decoder's options.
        fast_end = end if self._decoder.options is not None else 0
        pos = 0
        self._need = 0
        try:
            while pos < end:
                if self._cutter is not None:   # the common frames, up to any other
                    pos, in_sinks = self._cutter.cut(data, pos, fast_end,
                                                     self.max_response_size, wake)
                    stored += in_sinks
                    if pos == end:
                        break
                stop = self._frame(data, pos, end, wake)
                if stop is None:
                    break
                pos = stop
            return pos
        finally:
            self.stats.responses += len(wake) - first + len(self._ready) - first_ready + stored
            if self._queue:
                self._let_in(wake)

    def _frame(self, data, pos, end, wake):
        """The frame at ``pos``, parsed the general way: its end, or None (with
        ``_need`` set) when it is not all here yet."""
        length, start = slow_prefix(data, pos, end)
        if length is None:
            return None
        if not 0 < length <= self.max_response_size:
            raise ProtocolError("bad frame length %d (limit %d bytes)"
                                % (length, self.max_response_size))
        stop = start + length
        if stop > end:
            self._need = stop - pos   # nothing to parse before it is whole
            return None
        sync, code, schema, body = parse_header(data, start, stop)
        if code == IPROTO_EVENT:
            # A watcher's notification: it carries the sync of the last
            # IPROTO_WATCH on its key, which never waits in _pending.  With no
            # one to hand it to (a socket being drained, its watchers moved to
            # the next one) it is dropped: the next socket's own event comes.
            self.stats.responses += 1
            if self.on_event is not None:
                self.on_event(sync, body)
            return stop
        waiter = self._pending.pop(sync, None)
        if code == IPROTO_CHUNK and waiter is not None:
            # A push message (box.session.push): kept until the final reply.
            if type(waiter) is not _Pushes:
                waiter = _Pushes(waiter, self._decoder)
            waiter.pushes.append((code, schema, body))
            self._pending[sync] = waiter
            self.stats.responses += 1
        elif waiter is not None:
            if type(waiter) is _Pushes:
                waiter, value = waiter.final((sync, code, schema, body))
            elif type(waiter) is ReplySink or code >= REQUEST_TYPE_ERROR:
                # A pipeline's reply and an error's body stay bytes, decoded when read.
                value = (sync, code, schema, body, None)
            else:
                body = decode_or_error(self._decoder, body)
                if code == 0 and type(body) is dict:   # an OK reply, as the C cutter makes it
                    value = ok_response(None, sync, schema, body)
                    value._size = stop - pos
                else:
                    value = (sync, code, schema, body, None)
            self._deliver(waiter, value, wake)
        elif sync in self._abandoned:
            if code != IPROTO_CHUNK:
                self._abandoned.discard(sync)
                self.stats.discarded += 1
            self.stats.responses += 1
        else:
            raise ProtocolError("%s for unknown sync %d"
                                % ("push message" if code == IPROTO_CHUNK else "reply", sync))
        return stop

    def _deliver(self, waiter, value, wake):
        """Queue ``value`` for ``waiter``: a caller's greenlet in ``_ready``, a
        ``ReplySink`` in ``wake``."""
        if type(waiter) is ReplySink:
            wake.append((waiter, value))
        else:
            self._ready.append((waiter, value))

    # -- shutting down -------------------------------------------------------

    def _fail(self, exc, killer=None):
        """Mark dead, close the socket, fail every waiter, stop the other greenlet."""
        if self.error is not None:
            return
        self.error = exc
        if self._requester is not None:
            self._requester.stop()
        if self._read_watcher is not None:
            self._read_watcher.stop()   # before its descriptor is closed
        if self._write_watcher is not None:
            self._write_watcher.stop()
        try:
            self._sock.close()
        except OSError:
            pass
        wake = [(waiter, exc) for waiter in self._queue]   # callers in line raise it
        self._queue.clear()
        for waiter in self._pending.values():
            if type(waiter) is _Pushes:
                waiter = waiter.waiter
            self._deliver(waiter, exc, wake)
        self._pending.clear()
        self._abandoned.clear()
        self._wbuf.clear()
        self._wake(wake)
        for glet in (self._reader, self._writer):
            if glet is not killer and glet is not getcurrent():
                glet.kill(block=False)
        if self.on_fail is not None:
            self.on_fail(exc)

    def abort(self, exc):
        """``close()`` without joining: for finalizers, which must not block."""
        self._fail(exc)

    def close(self, exc=None):
        """Fail all waiters with ``exc`` and kill and join the reader and writer."""
        self._fail(exc or ConnectionClosed("connection closed"))
        current = getcurrent()
        for glet in (self._reader, self._writer):
            if glet is not current:
                glet.kill(block=True)

    def _inherited(self):
        """In a process forked since the transport opened: fail it (once), without
        reading or writing a byte, and return an ``InheritedSocket``.  (``_fail``
        closes only this process's descriptor: no shutdown, nothing sent.)"""
        exc = InheritedSocket("the socket of this connection was opened by process %d: "
                              "this process was forked from it since" % (self._pid,))
        if self.error is None:
            self._fail(exc)
        return exc

    def detach_after_fork(self):
        """In a forked child: make this process's copy of the socket dead without
        touching the stream the parent still uses (no shutdown, no reads)."""
        fd = self._sock.fileno()
        if fd < 0:
            return
        a, b = socket.socketpair()
        try:
            os.dup2(a.fileno(), fd)
        finally:
            a.close()
            b.close()


#: The reply kept for a request registered under a checking sink (see
#: ``ReplySink``) that succeeded: its code, 0; no schema version, no body.
#: (The C reader's is the same object when the package was built with it.)
CHECKED = compiled.speedups.CHECKED if compiled.speedups is not None else (0, None, b"")


class SinkFields:
    """A sink's fields: the Python twin of ``_speedups.SinkCore`` (see
    ``_speedups.c``), whose C paths read and write them as struct fields.
    ``ReplySink`` derives from the C type when the package was built with a
    compiler, from this class otherwise (chosen once, here, at import)."""

    __slots__ = ("syncs", "replies", "outstanding", "waiter", "owner")


if TYPE_CHECKING:   # (the checker reads the twin: the C module's stub is untyped)
    _SinkBase = SinkFields
else:
    _SinkBase = compiled.speedups.SinkCore if compiled.speedups is not None else SinkFields


class ReplySink(_SinkBase):
    """Where the replies to many requests go (a pipeline's; see ``send_many``).

    The reader stores each reply in ``replies`` as ``sync -> (code, schema
    version, body bytes)``, or the exception that failed the connection, and
    wakes ``waiter`` (a gevent ``Waiter``, while someone waits) when
    ``outstanding`` reaches 0.  ``syncs`` lists the requests queued for it, in
    order (its owner adds those it failed to queue, with their errors).

    ``ReplySink(owner)`` makes a checking sink for ``owner``: the requests
    registered under it (``send_frames``) are ``owner``'s (its ``syncs``,
    ``outstanding`` and ``waiter``), but a success stores ``CHECKED`` in
    ``owner.replies``, nothing of its body kept (an insert's reply carries
    the whole tuple back); an error reply is stored as any other.
    """

    __slots__ = ()

    def __init__(self, owner=None):
        self.syncs = []
        self.replies = {}
        self.outstanding = 0
        self.waiter = None
        self.owner = owner

    def switch(self, value):
        """From the hub: a reply the reader took the general way, the error
        that failed the connection, or None once the last reply is in."""
        sink = self if self.owner is None else self.owner
        if value is not None:
            if sink.outstanding <= 0:
                return   # failed or given up already: nothing changes
            replies = sink.replies
            if type(value) is tuple:
                sync, code, schema, body, _ = value
                if code == 0 and sink is not self:   # a checking sink's success
                    replies[sync] = CHECKED
                else:
                    replies[sync] = (code, schema, body)
                sink.outstanding -= 1
            else:
                for sync in sink.syncs:
                    if sync not in replies:
                        replies[sync] = value
                sink.outstanding = 0
        # Checked again: more requests may have gone out since a None was queued.
        # (At or below 0, never a strict 0: a wait must not outlive its replies.)
        if sink.outstanding <= 0 and sink.waiter is not None:
            sink.waiter.switch(None)


class _Pushes:
    """Stands in for the waiter of a request that got push messages (a caller's
    greenlet or a ``ReplySink``) until the final reply comes."""

    __slots__ = ("waiter", "pushes", "decoder")

    def __init__(self, waiter, decoder):
        self.waiter = waiter
        self.pushes = []
        self.decoder = decoder

    def final(self, reply):
        """``(waiter, value)`` for the final ``reply`` ``(sync, code, schema
        version, body bytes)``: the reply with the pushes attached, their bodies
        decoded for a greenlet (a ``ReplySink`` decodes them itself)."""
        pushes = self.pushes
        if type(self.waiter) is not ReplySink:
            if reply[1] < REQUEST_TYPE_ERROR:   # (an error's body is decoded when read)
                reply = reply[:3] + (decode_or_error(self.decoder, reply[3]),)
            pushes = [(code, schema, decode_or_error(self.decoder, body))
                      for code, schema, body in pushes]
        return self.waiter, reply + (pushes,)


def _joined(buf, queued):
    """The first ``queued`` pieces of a write buffer in one bytes object: a
    batch of whole requests queued alone (``send_frames``: megabytes) as it
    is, without a copy."""
    if queued == 2 and not buf[1]:
        return buf[0]
    return b"".join(buf if queued == len(buf) else buf[:queued])


def _wake_all(pairs):
    for waiter, value in pairs:
        waiter.switch(value)


def _lost(message, errno_=errno.ECONNRESET):
    exc = NetworkError(message)
    exc.errno = errno_
    exc.applied = None   # (the requests in flight may have run; an unsent one gets a copy)
    return exc


def _network_error(exc, what):
    if isinstance(exc, NetworkError):
        return exc
    return _lost("lost connection to server during %s: %s" % (what, exc),
                 getattr(exc, "errno", None) or errno.ECONNRESET)
