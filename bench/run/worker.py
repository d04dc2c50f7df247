"""One worker process: connect, then run each phase when the start barrier opens.

Messages to the parent, over this worker's own pipe:
``("ready",)`` once connected; ``("tick", phase, second, counts, errors)`` about once a second;
``("phase", result)`` when a phase is over; ``("done",)`` after closing; or
``("error", traceback)``.
"""
import resource
import signal
import threading
import time
import traceback

from bench import drivers
from bench.core import otel, workloads
from bench.core.openloop import OpenPhase, Schedule
from bench.profiling import workers as profiling

BARRIER_TIMEOUT = 600.0  # seconds; the parent aborts the barrier itself when a run fails


def main(index, config, host, port, pipe, barrier):
    # Ctrl-C reaches the whole process group; the parent alone decides how to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    providers = ()
    try:
        if config.otel is not None:
            providers = otel.instrument(config.otel)
        driver = drivers.make(config, host, port)
        profile = profiling.WorkerProfile(config, index)
        with profile.section():
            driver.open()
        pipe.send(("ready",))
        inserted = 0
        for build in workloads.plan(config, index):
            phase = build(inserted)
            if config.rate is not None and phase.name != "load":
                # Open loop: the phase's requests at their intended times (a load phase
                # fills the space as fast as it can).
                phase = OpenPhase(phase, Schedule(
                    config.rate, config.procs, index, config.arrivals, config.seed + index,
                    count=phase.count, duration=config.duration))
            barrier.wait(BARRIER_TIMEOUT)
            result = measure(driver, phase, config, pipe.send, profile)
            profile.ops += sum(result["counts"].values())
            pipe.send(("phase", result))
            if phase.name == "insert":
                inserted = sum(result["counts"].values())   # keys handed out, all recorded
        with profile.section():
            driver.close()
        profile.save()
        pipe.send(("done",))
    except threading.BrokenBarrierError:
        pass  # the parent gave up on the run and says why
    except Exception:
        pipe.send(("error", "worker %d:\n%s" % (index, traceback.format_exc())))
    finally:
        for provider in providers:   # (a worker's exit runs no atexit hook)
            provider.shutdown()
        pipe.close()


def measure(driver, phase, config, send, profile):
    """Run one phase and return its figures; client CPU covers all threads of the process."""
    is_open = isinstance(phase, OpenPhase)
    recorder = (driver.open_recorder_class if is_open else driver.recorder_class)(
        phase.name, send)
    requests_before = dict(driver.requests)
    counters_before = driver.counters()
    system_before = resource.getrusage(resource.RUSAGE_SELF).ru_stime
    cpu_before = time.process_time()
    start = time.monotonic()
    # A load phase inserts its records whatever the duration of the run phase.
    phase.start(None if phase.name == "load" else config.duration)
    # The measured section: profiling (--profile) resumes right before this call and pauses
    # right after it, so profiles hold the requests (and the connection's open and close).
    with profile.section():
        driver.run(phase, recorder)
    end = time.monotonic()
    cpu = time.process_time() - cpu_before
    system = resource.getrusage(resource.RUSAGE_SELF).ru_stime - system_before
    recorder.flush(end)
    counters_after = driver.counters()
    connection = None
    if counters_after is not None:
        connection = {name: counters_after[name] - counters_before.get(name, 0)
                      for name in counters_after}
        # a high-water mark is not a difference
        if "max_in_flight" in counters_after:
            connection["max_in_flight"] = counters_after["max_in_flight"]
    extra = {}
    if is_open:
        extra = {"service_histograms": recorder.service_histograms(),
                 "open_loop": phase.figures(), "max_lag": recorder.max_lag,
                 "last_send": recorder.last_send}
    return {
        **extra,
        # Requests the composite operations (tx, scan) sent, by box.stat name.
        "requests": {name: n - requests_before.get(name, 0)
                     for name, n in driver.requests.items()
                     if n != requests_before.get(name, 0)},
        "phase": phase.name,
        "start": start,
        "end": end,
        "cpu_seconds": cpu,
        "cpu_system_seconds": system,   # the kernel's part of cpu_seconds
        "counts": dict(recorder.counts),
        "errors": [[op, kind, n] for (op, kind), n in recorder.errors.items()],
        "histograms": recorder.histograms(),   # {series: {op: encoded}}
        "intervals": recorder.intervals(),
        "connection": connection,
    }
