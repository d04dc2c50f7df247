"""gtarantool.contrib.opentelemetry against real servers, with the SDK's in-memory
span exporter and metric reader: spans per request under the caller's own span,
their attributes and errors, pipelines, streams, pools, routers, the metrics,
uninstrument(), and the Prometheus exporter scraped over HTTP."""
import random
import urllib.request

import gevent
import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider, sampling
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import start_http_server
from tarantool.error import DatabaseError, NetworkError

import gtarantool
from gtarantool import Mode, RequestTimeout, monitoring
from gtarantool.contrib.opentelemetry import DURATION_BUCKETS, GtarantoolInstrumentor
from gtarantool.errors import applied
from gtarantool.sharding import Router
from gtarantool.testing.cluster import ShardedCluster, vshard_missing
from gtarantool.testing.server import binary_version

from .conftest import PASSWORD, USER

STREAMS = binary_version() >= (2, 10)
STORAGE = """
if not box.info.ro then box.once('kv', function()
    local s = box.schema.space.create('kv')
    s:create_index('pk', {parts = {{1, 'unsigned'}}})
end) end
function put(bucket_id, id) box.space.kv:replace{id, bucket_id} return true end
function get(id) return box.space.kv:get(id) ~= nil end
"""


class Telemetry:
    """A tracer provider and a meter provider that keep what they get in memory."""

    def __init__(self):
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.tracer = self.tracer_provider.get_tracer("tests")

    def finished(self, kind=SpanKind.CLIENT):
        return [span for span in self.spans.get_finished_spans() if span.kind is kind]

    def points(self, name):
        data = self.reader.get_metrics_data()
        found = []
        for resource in (data.resource_metrics if data else ()):
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        found += list(metric.data.data_points)
        return found

    def requests_recorded(self):
        return sum(point.count for point in self.points("db.client.operation.duration"))


@pytest.fixture
def telemetry():
    t = Telemetry()
    instrumentor = GtarantoolInstrumentor()
    instrumentor.instrument(tracer_provider=t.tracer_provider, meter_provider=t.meter_provider)
    try:
        yield t
    finally:
        instrumentor.uninstrument()
        t.meter_provider.shutdown()


def address(server):
    return {"server.address": server.host, "server.port": server.port}


def test_each_greenlets_request_span_is_a_child_of_that_greenlets_own_span(telemetry,
                                                                            server, conn):
    """100 greenlets, each under a span of its own, on one connection: the replies
    come back in another order and through the reader greenlet, and each request's
    span still has its own greenlet's span as parent."""
    parents = {}

    def one(i):
        with telemetry.tracer.start_as_current_span("work-%d" % i) as parent:
            parents[i] = parent.get_span_context()
            conn.call("sleep_and_return", (random.random() * 0.05, i))

    gevent.joinall([gevent.spawn(one, i) for i in range(100)], raise_error=True)
    spans = telemetry.finished()
    assert len(spans) == 100
    for span in spans:
        assert span.name == "call sleep_and_return"
        parent = span.parent
        assert parent is not None
        owner = [i for i, context in parents.items() if context.span_id == parent.span_id]
        assert len(owner) == 1
        assert span.context.trace_id == parents[owner[0]].trace_id
    assert len({span.parent.span_id for span in spans}) == 100


def test_data_methods_carry_the_database_conventions_attributes(telemetry, server, conn):
    conn.replace("tester", (1, "one"))
    conn.select("tester", 1)
    conn.update("tester", 1, [("=", 1, "uno")])
    conn.upsert("tester", (1, "one"), [("=", 1, "one")])
    conn.delete("tester", 1)
    conn.call("echo", 1, 2)
    conn.eval("return ...", 3)
    conn.ping()
    spans = {span.name: span for span in telemetry.finished()}
    assert sorted(spans) == ["call echo", "delete tester", "eval", "ping", "replace tester",
                             "select tester", "update tester", "upsert tester"]
    for op in ("replace", "select", "update", "upsert", "delete"):
        assert dict(spans[op + " tester"].attributes) == dict(
            {"db.system.name": "tarantool", "db.operation.name": op,
             "db.collection.name": "tester"}, **address(server))
    assert dict(spans["call echo"].attributes) == dict(
        {"db.system.name": "tarantool", "db.operation.name": "call",
         "db.stored_procedure.name": "echo"}, **address(server))
    assert dict(spans["eval"].attributes) == dict(
        {"db.system.name": "tarantool", "db.operation.name": "eval"}, **address(server))
    for span in spans.values():
        assert span.kind is SpanKind.CLIENT
        assert span.status.status_code is StatusCode.UNSET


def test_sql_records_the_query_text_and_never_its_parameters(telemetry, conn):
    secret = "s3cret-%d" % random.randrange(10 ** 6)
    key = random.randrange(10 ** 9)
    conn.execute("INSERT INTO sqltest VALUES (?, ?)", [key, secret])
    statement = conn.prepare("SELECT name FROM sqltest WHERE id = ?")
    assert statement.execute([key]).data == [[secret]]
    statement.unprepare()
    spans = telemetry.finished()
    assert [span.name for span in spans] == ["execute", "prepare", "execute"]
    assert spans[0].attributes["db.query.text"] == "INSERT INTO sqltest VALUES (?, ?)"
    assert spans[1].attributes["db.query.text"] == "SELECT name FROM sqltest WHERE id = ?"
    assert spans[2].attributes["db.operation.name"] == "execute"
    for span in spans:
        assert secret not in repr(dict(span.attributes))


def test_errors_set_the_status_the_error_type_and_the_box_error_code(telemetry, conn):
    conn.replace("tester", (7, "x"))
    with pytest.raises(DatabaseError):
        conn.insert("tester", (7, "duplicate-payload"))
    with pytest.raises(DatabaseError):
        conn.call("raise_error", "secret-message")
    conn.request_timeout = 0.05
    try:
        with pytest.raises(RequestTimeout):
            conn.call("sleep_and_return", 1, 1)
    finally:
        conn.request_timeout = None
    duplicate, raised, timed_out = telemetry.finished()[1:]
    assert duplicate.attributes["error.type"] == "3"
    assert duplicate.attributes["db.response.status_code"] == "3"
    assert raised.attributes["error.type"] == "555"
    assert raised.attributes["db.response.status_code"] == "555"
    assert timed_out.attributes["error.type"] == "gtarantool.errors.RequestTimeout"
    assert "db.response.status_code" not in timed_out.attributes
    for span in (duplicate, raised, timed_out):
        assert span.status.status_code is StatusCode.ERROR
        assert "payload" not in str(span.status.description)
        assert "secret" not in str(span.status.description)
    failed = [point for point in telemetry.points("db.client.operation.duration")
              if "error.type" in point.attributes]
    assert sorted(point.attributes["error.type"] for point in failed) == [
        "3", "555", "gtarantool.errors.RequestTimeout"]
    # (written and unanswered: the duration's error.type, no connection timeout)
    assert telemetry.points("db.client.connection.timeouts") == []


def test_a_call_that_got_no_request_slot_in_time_is_a_connection_timeout(telemetry, server):
    """The conventions' db.client.connection.timeouts counts a call whose time
    ran out before it got a connection: here, in line for max_in_flight's one
    slot (nothing written, applied False)."""
    c = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD,
                           max_in_flight=1, request_timeout=5)
    try:
        busy = gevent.spawn(c.call, "sleep_and_return", 1, 1)   # the slot, for 1 s
        gevent.sleep(0.05)
        c.request_timeout = 0.2
        with pytest.raises(RequestTimeout) as caught:
            c.call("sleep_and_return", 0, 2)
        assert applied(caught.value) is False
        assert busy.get(timeout=5).data == [1]
    finally:
        c.close()
    timeouts = telemetry.points("db.client.connection.timeouts")
    assert [point.value for point in timeouts] == [1]
    assert timeouts[0].attributes["db.client.connection.pool.name"] == "%s:%d" % (
        server.host, server.port)


def test_a_pipeline_is_one_batch_span(telemetry, server, conn):
    base = random.randrange(10 ** 6, 10 ** 9)
    with conn.pipeline() as pipe:
        for i in range(300):
            pipe.replace("tester", (base + i, "p"))
    mixed = conn.pipeline()
    mixed.select("tester", base)
    mixed.call("echo", 1)
    mixed.results()
    same, other = telemetry.finished()
    assert same.name == "BATCH replace tester"
    assert dict(same.attributes) == dict(
        {"db.system.name": "tarantool", "db.operation.name": "BATCH replace",
         "db.collection.name": "tester", "db.operation.batch.size": 300}, **address(server))
    assert other.name == "BATCH"
    assert other.attributes["db.operation.batch.size"] == 2
    assert telemetry.requests_recorded() == 2


def test_select_many_and_send_frames_are_counted_in_their_pipelines_span(telemetry, conn):
    """Requests a pipeline takes in bulk (select_many, send_frames: copy_from's
    path) are in its span and its duration as the others are."""
    from gtarantool.copy import copy_from
    from gtarantool.protocol.constants import REQUEST_TYPE_REPLACE
    base = random.randrange(10 ** 6, 10 ** 9)
    with conn.pipeline() as pipe:
        pipe.select_many("tester", [base, base + 1, base + 2])
    mixed = conn.pipeline()
    mixed.select("tester", base)
    mixed.select_many("tester", [base + 1, base + 2])
    mixed.results()
    framed = conn.pipeline()
    encoder = framed._encoder
    prefix, suffix = encoder.batch_parts(REQUEST_TYPE_REPLACE, conn.space("tester").space_no)
    first = framed.take_syncs(2)
    frames = encoder.encode_batch(REQUEST_TYPE_REPLACE, prefix, [(base, "f"), (base + 1, "f")],
                                  first, suffix)
    framed.send_frames(frames, first, 2, code=REQUEST_TYPE_REPLACE)
    framed.results()
    selects, both, replaces = telemetry.finished()
    assert (selects.name, selects.attributes["db.operation.batch.size"]) == (
        "BATCH select tester", 3)
    assert (both.name, both.attributes["db.operation.batch.size"]) == ("BATCH select tester", 3)
    assert (replaces.name, replaces.attributes["db.operation.batch.size"]) == (
        "BATCH replace", 2)
    assert telemetry.requests_recorded() == 3
    report = copy_from(conn, "tester", [(base + 10 + i, "c") for i in range(10)], mode="replace")
    assert report.written == 10
    spans = [span for span in telemetry.finished() if span.name.startswith("BATCH replace")]
    assert sum(span.attributes["db.operation.batch.size"] for span in spans) == 12


@pytest.mark.skipif(not STREAMS, reason="streams need Tarantool 2.10+")
def test_a_streams_requests_carry_its_stream_id(telemetry, conn):
    stream = conn.stream()
    stream.replace("tester", (11, "stream"))
    stream.call("echo", 1)
    conn.select("tester", 11)
    names = [(span.name, span.attributes.get("tarantool.stream.id"))
             for span in telemetry.finished()]
    assert names == [("replace tester", stream.stream_id), ("call echo", stream.stream_id),
                     ("select tester", None)]


def test_the_duration_histogram_counts_every_request(telemetry, conn):
    made = 0
    for i in range(37):
        conn.select("tester", i)
        made += 1
    for i in range(5):
        conn.call("echo", i)
        made += 1
    assert telemetry.requests_recorded() == made == len(telemetry.finished())
    points = telemetry.points("db.client.operation.duration")
    assert tuple(points[0].explicit_bounds) == DURATION_BUCKETS
    selects = [p for p in points if p.attributes["db.operation.name"] == "select"]
    assert [p.count for p in selects] == [37]


def test_connection_metrics_count_connections_and_pending_requests(telemetry, server, conn):
    conn.ping()
    busy = [gevent.spawn(conn.call, "sleep_and_return", 1.0, 1) for _ in range(3)]
    with gevent.Timeout(5):
        while conn._transport.in_flight < 3:
            gevent.sleep(0.01)
    name = "%s:%s" % (server.host, server.port)
    pending = [p.value for p in telemetry.points("db.client.connection.pending_requests")
               if p.attributes["db.client.connection.pool.name"] == name]
    used = [p.value for p in telemetry.points("db.client.connection.count")
            if p.attributes["db.client.connection.pool.name"] == name
            and p.attributes["db.client.connection.state"] == "used"]
    gevent.joinall(busy, raise_error=True)
    assert pending and pending[0] >= 3
    assert used and used[0] >= 1


def test_pool_spans_name_the_instance_that_answered_and_the_mode(telemetry, server):
    pool = gtarantool.ConnectionPool(["%s:%s" % (server.host, server.port)], user=USER,
                                     password=PASSWORD)
    try:
        pool.select("tester", 1)
        pool.replace("tester", (5, "pool"))
        pool.call("echo", 1, mode=Mode.PREFER_RO)
    finally:
        pool.close()
    spans = telemetry.finished()
    assert [span.name for span in spans] == ["select tester", "replace tester", "call echo"]
    for span, mode in zip(spans, ("ANY", "RW", "PREFER_RO")):
        assert span.attributes["tarantool.pool.mode"] == mode
        assert span.attributes["server.address"] == server.host
        assert span.attributes["server.port"] == server.port
    assert telemetry.requests_recorded() == 3


def test_uninstrument_stops_everything_on_connections_made_before(server, conn):
    t = Telemetry()
    instrumentor = GtarantoolInstrumentor()
    instrumentor.instrument(tracer_provider=t.tracer_provider, meter_provider=t.meter_provider)
    conn.select("tester", 1)
    pool = gtarantool.ConnectionPool(["%s:%s" % (server.host, server.port)], user=USER,
                                     password=PASSWORD)
    try:
        pool.select("tester", 1)
        assert len(t.finished()) == 2
        instrumentor.uninstrument()
        conn.select("tester", 1)
        conn.call("echo", 1)
        pool.select("tester", 1)
        with conn.pipeline() as pipe:
            pipe.select("tester", 1)
    finally:
        pool.close()
        instrumentor.uninstrument()
    assert len(t.finished()) == 2
    assert t.requests_recorded() == 2
    assert t.points("db.client.connection.count") == []
    assert monitoring.listeners() == ()
    assert "__wrapped__" not in vars(type(conn)).get("select", lambda: 0).__dict__
    t.meter_provider.shutdown()


def test_the_library_s_own_requests_make_no_span(telemetry, server):
    """Connecting (authentication, the schema) and a pool's role checks."""
    conn = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD)
    pool = gtarantool.ConnectionPool(["%s:%s" % (server.host, server.port)], user=USER,
                                     password=PASSWORD, refresh_delay=0.05)
    try:
        gevent.sleep(0.3)
        conn.select("tester", 1)
    finally:
        pool.close()
        conn.close()
    assert [span.name for span in telemetry.finished()] == ["select tester"]


def test_the_prometheus_exporter_serves_the_duration_metric(server, conn):
    reader = PrometheusMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    instrumentor = GtarantoolInstrumentor()
    instrumentor.instrument(tracer_provider=TracerProvider(), meter_provider=meter_provider)
    httpd, thread = start_http_server(0, addr="127.0.0.1")
    try:
        for i in range(12):
            conn.select("tester", i)
        url = "http://127.0.0.1:%d/metrics" % httpd.server_port
        text = gevent.get_hub().threadpool.spawn(
            lambda: urllib.request.urlopen(url, timeout=10).read().decode()).get()
    finally:
        instrumentor.uninstrument()
        httpd.shutdown()
        thread.join(5)
        meter_provider.shutdown()   # (unregisters the reader from prometheus_client)
    counts = [line for line in text.splitlines()
              if line.startswith("db_client_operation_duration_seconds_count")
              and 'db_operation_name="select"' in line]
    assert len(counts) == 1, text
    assert counts[0].rsplit(" ", 1)[1] in ("12", "12.0")
    assert 'le="0.005"' in text


@pytest.mark.skipif(vshard_missing() is not None, reason=str(vshard_missing()))
def test_router_spans_carry_the_bucket_and_replica_set_and_re_routes_are_events(telemetry):
    cluster = ShardedCluster(2, replicas=0, storage_lua=STORAGE).start()
    try:
        router = Router(cluster.cfg, user=cluster.user, password=cluster.password)
        with gevent.Timeout(10):
            while router.known_bucket_count < cluster.bucket_count:
                gevent.sleep(0.02)
        bucket_id = 7
        source = cluster.shard(cluster.buckets()[bucket_id])
        target = next(shard for shard in cluster.shards if shard is not source)
        masters = {shard.name: (shard.master.host, shard.master.port)
                   for shard in (source, target)}
        router.callrw(bucket_id, "put", (bucket_id, 1), timeout=5)
        cluster.bucket_send(bucket_id, target.uuid)
        router.callro(bucket_id, "get", (1,), timeout=5)
        router.close()
    finally:
        cluster.cleanup()
    spans = [span for span in telemetry.finished() if span.name in ("call put", "call get")]
    assert [span.name for span in spans] == ["call put", "call get"]
    put, get = spans
    assert put.attributes["tarantool.vshard.bucket_id"] == bucket_id
    assert put.attributes["tarantool.vshard.replicaset"] == source.name
    assert put.attributes["tarantool.pool.mode"] == "RW"
    assert put.attributes["db.stored_procedure.name"] == "put"
    assert (put.attributes["server.address"], put.attributes["server.port"]) == (
        masters[source.name])
    assert get.attributes["tarantool.vshard.replicaset"] == target.name
    assert (get.attributes["server.address"], get.attributes["server.port"]) == (
        masters[target.name])
    events = [event.name for event in get.events]
    assert events == ["gtarantool.bucket_moved", "gtarantool.resend"]
    moved = get.events[0].attributes
    # (A bucket still being sent is refused BUCKET_IS_LOCKED, which names no
    # destination: the router forgets the bucket and searches for it.)
    assert (moved["bucket_id"], moved["address"]) == (bucket_id, source.name)
    assert moved["to"] in (target.name, ""), dict(moved)
    assert not put.events


@pytest.mark.parametrize("sampler", [sampling.ALWAYS_OFF,
                                     sampling.ParentBased(sampling.ALWAYS_OFF)])
def test_a_sampler_that_drops_the_spans_leaves_the_durations(server, conn, sampler):
    """No span where the sampler records none; the histogram counts every request.
    Under a sampled parent a parent-based sampler's requests are spans again."""
    t = Telemetry()
    t.tracer_provider = TracerProvider(sampler=sampler)
    t.tracer_provider.add_span_processor(SimpleSpanProcessor(t.spans))
    parents = TracerProvider()
    parents.add_span_processor(SimpleSpanProcessor(t.spans))
    instrumentor = GtarantoolInstrumentor()
    instrumentor.instrument(tracer_provider=t.tracer_provider, meter_provider=t.meter_provider)
    try:
        for i in range(20):
            conn.select("tester", i)
        with pytest.raises(DatabaseError):
            conn.call("raise_error", "x")
        with parents.get_tracer("tests").start_as_current_span("sampled parent"):
            conn.select("tester", 1)
    finally:
        instrumentor.uninstrument()
        t.meter_provider.shutdown()
    spans = t.finished()
    if sampler is sampling.ALWAYS_OFF:
        assert spans == []
    else:
        assert [span.name for span in spans] == ["select tester"]
    assert t.requests_recorded() == 22
    failed = [p for p in t.points("db.client.operation.duration") if "error.type" in p.attributes]
    assert [p.attributes["error.type"] for p in failed] == ["555"]


def test_schema_fetches_make_no_span(telemetry, server, conn):
    """A space the schema cache does not know yet is fetched (selects of _vspace and
    _vindex): neither a span of its own nor, in a pool's request, an attempt."""
    names = ["otel_schema_%d_%d" % (random.randrange(10 ** 9), i) for i in range(2)]
    pool = gtarantool.ConnectionPool(["%s:%s" % (server.host, server.port)], user=USER,
                                     password=PASSWORD)
    try:
        pool.ping(mode=Mode.ANY)
        for name in names:   # (created after both connected: unknown to their caches)
            conn.eval("box.schema.space.create(...):create_index('pk')", name)
        telemetry.spans.clear()
        recorded = telemetry.requests_recorded()
        conn.insert(names[0], (1,))
        pool.insert(names[1], (1,))
        spans = telemetry.finished()
        assert telemetry.requests_recorded() - recorded == 2
    finally:
        pool.close()
        for name in names:
            conn.eval("box.space[...]:drop()", name)
    assert [span.name for span in spans] == ["insert " + names[0], "insert " + names[1]]
    assert [event.name for event in spans[1].events] == []


def test_a_statement_s_own_re_prepare_is_an_event_on_its_execute_span(telemetry, conn):
    """A statement freed on the server behind its back (box.unprepare in the
    session) is prepared again by execute() itself."""
    sql = "SELECT name FROM sqltest WHERE id = ? -- %d" % random.randrange(10 ** 9)
    second = conn.prepare(sql)
    conn.eval("box.unprepare(...)", second.stmt_id)
    telemetry.spans.clear()
    recorded = telemetry.requests_recorded()
    assert second.execute([0]).data == []
    second.unprepare()
    spans = telemetry.finished()
    assert [span.name for span in spans] == ["execute"]
    assert [event.name for event in spans[0].events] == ["gtarantool.reprepare"]
    assert spans[0].attributes["db.query.text"] == sql
    assert telemetry.requests_recorded() - recorded == 1


def test_the_duration_metric_has_no_per_stream_nor_per_batch_attribute(telemetry, conn):
    """Stream ids and batch sizes are span attributes only: on the metric each
    would open series without end."""
    base = random.randrange(10 ** 6, 10 ** 9)
    for size in (2, 3, 4):
        with conn.pipeline() as pipe:
            for i in range(size):
                pipe.replace("tester", (base + i, "p"))
    streams = [conn.stream() for _ in range(3)] if STREAMS else []
    for stream in streams:
        stream.replace("tester", (base, "s"))
    spans = telemetry.finished()
    assert [span.attributes["db.operation.batch.size"] for span in spans[:3]] == [2, 3, 4]
    assert [span.attributes["tarantool.stream.id"] for span in spans[3:]] == [
        stream.stream_id for stream in streams]
    points = telemetry.points("db.client.operation.duration")
    for point in points:
        assert "tarantool.stream.id" not in point.attributes
        assert "db.operation.batch.size" not in point.attributes
    assert sorted((p.attributes["db.operation.name"], p.count) for p in points) == (
        [("BATCH replace", 3)] + [("replace", 3)] * bool(streams))


def _refused_port():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_network_error_s_errno_is_no_box_error_code(telemetry):
    """tarantool-python's NetworkError keeps a refused connect's errno as its code."""
    lazy = gtarantool.Connection("127.0.0.1", _refused_port(), connect_now=False,
                                 reconnect_max_attempts=0)
    with pytest.raises(NetworkError) as raised:
        lazy.select("tester", 1)
    assert raised.value.code   # (the errno, ECONNREFUSED)
    span, = telemetry.finished()
    assert span.attributes["error.type"] == "tarantool.error.NetworkError"
    assert "db.response.status_code" not in span.attributes
    assert span.status.description == "tarantool.error.NetworkError"
    point, = telemetry.points("db.client.operation.duration")
    assert point.attributes["error.type"] == "tarantool.error.NetworkError"
    assert "db.response.status_code" not in point.attributes


def test_a_pool_s_execute_records_its_query_text(telemetry, server):
    sql = "SELECT name FROM sqltest WHERE id = ?"
    pool = gtarantool.ConnectionPool(["%s:%s" % (server.host, server.port)], user=USER,
                                     password=PASSWORD)
    try:
        pool.execute(sql, [0], mode=Mode.ANY)
    finally:
        pool.close()
    span, = telemetry.finished()
    assert span.name == "execute"
    assert span.attributes["db.query.text"] == sql
    point, = telemetry.points("db.client.operation.duration")
    assert "db.query.text" not in point.attributes


def test_a_pipeline_of_one_request_is_that_request_s_span(telemetry, server, conn):
    """The conventions' batch has two operations or more (its size is never 1)."""
    key = random.randrange(10 ** 6, 10 ** 9)
    with conn.pipeline() as pipe:
        pipe.replace("tester", (key, "one"))
    pipe = conn.pipeline()
    pipe.select_many("tester", [key])
    pipe.wait()
    replace, select = telemetry.finished()
    assert replace.name == "replace tester"
    assert dict(replace.attributes) == dict(
        {"db.system.name": "tarantool", "db.operation.name": "replace",
         "db.collection.name": "tester"}, **address(server))
    assert select.name == "select tester"
    assert "db.operation.batch.size" not in select.attributes
    assert sorted(p.attributes["db.operation.name"]
                  for p in telemetry.points("db.client.operation.duration")) == [
        "replace", "select"]


def test_requests_made_in_a_pool_request_s_on_push_are_their_own(telemetry, server, conn):
    """The caller's on_push runs inside the pool's request: its requests are
    spans of their own (children of it), not attempts of that request."""
    pool = gtarantool.ConnectionPool(["%s:%s" % (server.host, server.port)], user=USER,
                                     password=PASSWORD)

    def on_push(message, ctx):
        pool.select("tester", 1, mode=Mode.ANY)
        conn.select("tester", 2)

    try:
        pool.ping(mode=Mode.ANY)
        telemetry.spans.clear()
        pool.call("push_three", "v", mode=Mode.RW, on_push=on_push)
    finally:
        pool.close()
    spans = telemetry.finished()
    call = spans[-1]
    assert call.name == "call push_three"
    assert call.attributes["tarantool.pool.mode"] == "RW"
    assert [event.name for event in call.events] == []
    inner = spans[:-1]
    assert [span.name for span in inner] == ["select tester"] * 6
    assert [span.attributes.get("tarantool.pool.mode") for span in inner] == ["ANY", None] * 3
    assert {span.parent.span_id for span in inner} == {call.context.span_id}


needs_vshard = pytest.mark.skipif(vshard_missing() is not None, reason=str(vshard_missing()))


@pytest.fixture(scope="module")
def cluster():
    """Two replica sets (no buckets moved: the tests that move them make their own)."""
    started = ShardedCluster(2, replicas=0, storage_lua=STORAGE).start()
    try:
        yield started
    finally:
        started.cleanup()


def router_of(cluster, **options):
    router = Router(cluster.cfg, user=cluster.user, password=cluster.password, **options)
    if options.get("discovery_mode") != "off":
        with gevent.Timeout(10):
            while router.known_bucket_count < cluster.bucket_count:
                gevent.sleep(0.02)
    return router


@needs_vshard
def test_a_router_s_own_requests_make_no_span(telemetry, cluster):
    """Connecting, counting the buckets, their discovery (again when woken), and a
    bucket's search (bucket_stat to every master, from greenlets of its own)."""
    router = router_of(cluster)
    try:
        router.discovery_wakeup()
        gevent.sleep(0.3)
        searching = router_of(cluster, discovery_mode="off")
        try:
            assert searching.callrw(7, "put", (7, 1), timeout=5) is True
        finally:
            searching.close()
    finally:
        router.close()
    spans = telemetry.finished()
    assert [span.name for span in spans] == ["call put"]
    assert spans[0].events == ()
    recorded = [(p.attributes.get("db.stored_procedure.name"), p.count)
                for p in telemetry.points("db.client.operation.duration")]
    assert recorded == [("put", 1)]


@needs_vshard
def test_map_callrw_is_one_span_under_the_caller_s(telemetry, cluster):
    """Its stages go to every master from greenlets of their own."""
    router = router_of(cluster)
    try:
        telemetry.spans.clear()
        with telemetry.tracer.start_as_current_span("map") as parent:
            assert len(router.map_callrw("get", (1,), timeout=5)) == 2
            router.map_callrw("get", (1,), timeout=5, bucket_ids=[1, 2])
    finally:
        router.close()
    spans = telemetry.finished()
    assert [span.name for span in spans] == ["call get", "call get"]
    for span in spans:
        assert span.parent.span_id == parent.get_span_context().span_id
        assert span.attributes["db.stored_procedure.name"] == "get"
        assert span.attributes["tarantool.vshard.method"] == "map_callrw"
    recorded = [(p.attributes.get("db.stored_procedure.name"), p.count)
                for p in telemetry.points("db.client.operation.duration")]
    assert recorded == [("get", 2)]


@needs_vshard
def test_router_calls_keep_their_bucket_off_the_metric(telemetry, cluster):
    router = router_of(cluster)
    try:
        for bucket_id in (1, 2, 3, 150, 299):
            router.callrw(bucket_id, "put", (bucket_id, bucket_id), timeout=5)
    finally:
        router.close()
    spans = [span for span in telemetry.finished() if span.name == "call put"]
    assert [span.attributes["tarantool.vshard.bucket_id"] for span in spans] == [
        1, 2, 3, 150, 299]
    points = [p for p in telemetry.points("db.client.operation.duration")
              if p.attributes.get("db.stored_procedure.name") == "put"]
    for point in points:
        assert "tarantool.vshard.bucket_id" not in point.attributes
    assert sum(point.count for point in points) == 5
    assert len(points) == len({span.attributes["tarantool.vshard.replicaset"]
                               for span in spans})


@needs_vshard
def test_a_router_s_bad_arguments_raise_what_they_raise_uninstrumented(cluster):
    router = router_of(cluster)
    calls = [lambda: router.callrw([1], "put", (1, 1)),
             lambda: router.callro(1, ["get"], (1,)),
             lambda: router.callrw(0, "put", (1, 1)),
             lambda: router.callrw(bucket_id={}, func="put"),
             lambda: router.map_callrw(["get"], (1,), timeout=5)]

    def outcomes():
        found = []
        for call in calls:
            try:
                call()
                found.append(None)
            except Exception as exc:
                found.append(type(exc))
        return found

    t = Telemetry()
    instrumentor = GtarantoolInstrumentor()
    try:
        plain = outcomes()
        instrumentor.instrument(tracer_provider=t.tracer_provider,
                                meter_provider=t.meter_provider)
        assert outcomes() == plain
    finally:
        instrumentor.uninstrument()
        router.close()
        t.meter_provider.shutdown()
    assert plain[0] is ValueError


def test_a_call_cut_by_a_timer_or_a_kill_is_in_the_duration_metric(telemetry, conn):
    """The calls a gevent.Timeout or a kill ends are the slowest: left out of the
    histogram, its percentiles would look better than the calls were."""
    with pytest.raises(gevent.Timeout):
        with gevent.Timeout(0.05):
            conn.call("sleep_and_return", 1, 1)
    worker = gevent.spawn(conn.call, "sleep_and_return", 1, 1)
    gevent.sleep(0.05)
    worker.kill()
    cut, killed = telemetry.finished()
    assert cut.attributes["error.type"] == "gevent.timeout.Timeout"
    assert killed.attributes["error.type"] == "greenlet.GreenletExit"
    points = telemetry.points("db.client.operation.duration")
    assert sorted(point.attributes["error.type"] for point in points) == [
        "gevent.timeout.Timeout", "greenlet.GreenletExit"]
    assert all(point.count == 1 and point.sum >= 0.04 for point in points)


def test_a_pipeline_whose_every_request_failed_is_a_failed_batch(telemetry, conn):
    """A pipeline's wait does not raise for its requests' errors (each is its
    result); a batch of which none succeeded is a failed operation all the same,
    and one of which some succeeded is not."""
    conn.replace("tester", (7, "x"))
    refused = conn.pipeline()
    refused.insert("tester", (7, "y"))
    refused.insert("tester", (7, "z"))
    assert all(isinstance(result, DatabaseError) for result in refused.results())
    partly = conn.pipeline()
    partly.insert("tester", (7, "y"))
    partly.select("tester", 7)
    partly.results()
    raised = conn.pipeline()
    raised.call("raise_error", "a")
    raised.insert("tester", (7, "w"))
    assert all(isinstance(result, DatabaseError) for result in raised.results())
    duplicates, mixed, both = telemetry.finished()[1:]
    assert duplicates.status.status_code is StatusCode.ERROR
    assert duplicates.attributes["error.type"] == "3"
    assert duplicates.attributes["db.response.status_code"] == "3"
    assert mixed.status.status_code is StatusCode.UNSET
    assert "error.type" not in mixed.attributes
    assert both.status.status_code is StatusCode.ERROR
    assert both.attributes["error.type"] == "555"   # (the first failure's)
    failed = sorted(point.attributes.get("error.type", "") for point in
                    telemetry.points("db.client.operation.duration")
                    if point.attributes["db.operation.name"].startswith("BATCH"))
    assert failed == ["", "3", "555"]
