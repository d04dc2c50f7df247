"""``--otel``: a load run's requests as OpenTelemetry spans and metrics.

Each worker process instruments gtarantool (``GtarantoolInstrumentor``) with an
SDK tracer and meter provider of its own, exporting as the standard
environment says: ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER``
(``otlp``, the default when ``opentelemetry-exporter-otlp`` is installed;
``console``; ``none``), ``OTEL_EXPORTER_OTLP_*`` for the OTLP exporters
(endpoint, protocol, headers), ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` for the resource.  The sampler is
``--otel``'s value: ``env`` (``OTEL_TRACES_SAMPLER``, parent-based always-on
by default), ``always_on``, or ``always_off`` (every span dropped: what the
instrumentation costs when nothing is sampled).
"""
import os

SAMPLERS = ("env", "always_on", "always_off")
DEFAULT_SERVICE = "gtarantool-bench"


def _exporter_name(variable):
    name = os.environ.get(variable, "").strip().lower()
    if name:
        return name
    try:
        import opentelemetry.exporter.otlp  # noqa: F401
    except ImportError:
        return "none"
    return "otlp"


def _otlp_module():
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    return "http" if protocol.startswith("http") else "grpc"


def _span_exporter():
    name = _exporter_name("OTEL_TRACES_EXPORTER")
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter
        return ConsoleSpanExporter()
    if name == "otlp":
        if _otlp_module() == "http":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        return OTLPSpanExporter()
    if name != "none":
        raise SystemExit("OTEL_TRACES_EXPORTER=%s: use otlp, console or none" % name)
    return None


def _metric_exporter():
    name = _exporter_name("OTEL_METRICS_EXPORTER")
    if name == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter
        return ConsoleMetricExporter()
    if name == "otlp":
        if _otlp_module() == "http":
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        else:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        return OTLPMetricExporter()
    if name != "none":
        raise SystemExit("OTEL_METRICS_EXPORTER=%s: use otlp, console or none" % name)
    return None


def instrument(sampler="env", span_exporter=None, metric_reader=None):
    """Instrument gtarantool in this process; the caller shuts the providers down
    (their last spans and metrics exported) when it is done.

    :param sampler: one of ``SAMPLERS``.
    :param span_exporter: an exporter to use instead of the environment's.
    :param metric_reader: a metric reader to use instead of the environment's;
        False for no metrics at all.
    :returns: the providers made: (tracer provider, meter provider), or the tracer
        provider alone without metrics.
    :raises SystemExit: the OpenTelemetry SDK is missing, or an unknown exporter.
    """
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider, sampling
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from gtarantool.contrib.opentelemetry import GtarantoolInstrumentor
    except ImportError as exc:
        raise SystemExit("--otel needs the otel extra and the SDK (in a checkout: "
                         "pip install '.[otel]' opentelemetry-sdk): %s" % exc)
    if sampler not in SAMPLERS:
        raise SystemExit("--otel %s: expected one of %s" % (sampler, ", ".join(SAMPLERS)))
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {
        "service.name": DEFAULT_SERVICE}
    resource = Resource.create(attributes)
    chosen = {"always_on": sampling.ALWAYS_ON, "always_off": sampling.ALWAYS_OFF}.get(sampler)
    tracer_provider = TracerProvider(resource=resource, sampler=chosen)
    span_exporter = span_exporter or _span_exporter()
    if span_exporter is not None:
        tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    readers = []
    if metric_reader is False:   # no metrics: the API's no-op meter provider
        from opentelemetry.metrics import NoOpMeterProvider
        GtarantoolInstrumentor().instrument(tracer_provider=tracer_provider,
                                            meter_provider=NoOpMeterProvider())
        return (tracer_provider,)
    if metric_reader is not None:
        readers.append(metric_reader)
    else:
        exporter = _metric_exporter()
        if exporter is not None:
            readers.append(PeriodicExportingMetricReader(exporter))
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    GtarantoolInstrumentor().instrument(tracer_provider=tracer_provider,
                                        meter_provider=meter_provider)
    return tracer_provider, meter_provider


class DiscardSpans:
    """A span exporter that drops what it gets: the spans' cost without an export's."""

    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass

    def force_flush(self, timeout_millis=30000):
        return True


def metric_reader():
    """A reader that keeps the metrics in memory (they are aggregated as recorded)."""
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    return InMemoryMetricReader()
