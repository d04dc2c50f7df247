"""One worker process: connect once, then each run the parent orders, each phase when the
start barrier opens.

Messages to the parent, over this worker's own pipe:
``("ready",)`` once connected; ``("tick", phase, second, counts, errors)`` about once a second;
``("phase", result)`` when a phase is over; ``("ran",)`` when a run is; ``("done",)`` after
closing; or ``("error", traceback)``.  The parent's orders come over a pipe of their own:
``("run", config)`` (one run, of any number of phases), ``("stop",)``.
"""
import gc
import os
import resource
import signal
import threading
import time
import traceback

from bench import drivers
from bench.core import dataset, otel, workloads
from bench.core.openloop import OpenPhase, Schedule
from bench.profiling import workers as profiling

BARRIER_TIMEOUT = 600.0  # seconds; the parent aborts the barrier itself when a run fails


def main(index, config, host, port, pipe, barrier, orders, shared=None):
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
        while True:
            try:
                order = orders.recv()
            except EOFError:
                return   # the parent is gone
            if order[0] == "stop":
                break
            run(index, order[1], driver, pipe, barrier, profile, shared)
            pipe.send(("ran",))
        with profile.section():
            driver.close()
        profile.save()
        pipe.send(("done",))
    except threading.BrokenBarrierError:
        pass  # the parent gave up on the run and says why
    except dataset.Exhausted as exc:   # (the workload's end, not a fault: no traceback)
        barrier.abort()
        pipe.send(("error", "worker %d: %s" % (index, exc)))
    except Exception:
        # Broken, the barrier frees the parent and the other workers at once.
        barrier.abort()
        pipe.send(("error", "worker %d:\n%s" % (index, traceback.format_exc())))
    finally:
        for provider in providers:   # (a worker's exit runs no atexit hook)
            provider.shutdown()
        pipe.close()
        orders.close()


def run(index, config, driver, pipe, barrier, profile, shared=None):
    """One run of ``config``: each of its phases when the start barrier opens."""
    # A run's objects frozen by the one before it may go now.
    gc.unfreeze()
    inserted = 0
    for build in workloads.plan(config, index, shared):
        phase = build(inserted)
        if config.rate is not None and phase.name != "load":
            # Open loop: the phase's requests at their intended times (a load phase
            # fills the space as fast as it can).
            phase = OpenPhase(phase, Schedule(
                config.rate, config.procs, index, config.arrivals, config.seed + index,
                count=phase.count, duration=phase_duration(config, phase.name)))
        barrier.wait(BARRIER_TIMEOUT)
        result = measure(driver, phase, config, pipe.send, profile)
        window = getattr(getattr(phase, "phase", phase), "window", None)
        if window is not None and window.exhausted:
            raise dataset.Exhausted(window.exhausted)
        profile.ops += sum(result["counts"].values())
        pipe.send(("phase", result))
        if phase.name == "insert":
            inserted = sum(result["counts"].values())   # keys handed out, all recorded
        if phase.name in ("load", "insert"):
            # What the load made lives as long as the run: out of the collector's
            # reach, so its full collections do not walk it during the measured phases.
            gc.collect()
            gc.freeze()


def measure(driver, phase, config, send, profile):
    """Run one phase and return its figures; client CPU covers all threads of the process."""
    is_open = isinstance(phase, OpenPhase)
    recorder = (driver.open_recorder_class if is_open else driver.recorder_class)(
        phase.name, send)
    if is_open and config.client_work:
        recorder.record_open = _working(recorder.record_open, config.client_work / 1e6)
    requests_before = dict(driver.requests)
    counters_before = driver.counters()
    system_before = resource.getrusage(resource.RUSAGE_SELF).ru_stime
    gc_before = [g["collections"] for g in gc.get_stats()]
    waited_before = runqueue_wait()
    cpu_before = time.process_time()
    start = time.monotonic()

    duration = phase_duration(config, phase.name)
    if not is_open:
        phase.start(duration)   # (it sets the ``take`` the driver's workers hold)

    def started():
        # An open loop's schedule starts once every greenlet, thread or task exists:
        # spawning them is not counted against the first requests.
        if is_open:
            phase.start(duration)
    # The measured section: profiling (--profile) resumes right before this call and pauses
    # right after it, so profiles hold the requests (and the connection's open and close).
    with profile.section():
        driver.run(phase, recorder, started)
    end = time.monotonic()
    cpu = time.process_time() - cpu_before
    system = resource.getrusage(resource.RUSAGE_SELF).ru_stime - system_before
    gc_collections = [g["collections"] - b for g, b in zip(gc.get_stats(), gc_before)]
    waited_after = runqueue_wait()
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
        "gc_collections": gc_collections,   # by generation, during the phase
        # Seconds this process was ready to run but waited for a CPU (a busy host).
        "cpu_wait_seconds": None if waited_before is None or waited_after is None
        else waited_after - waited_before,
        "counts": dict(recorder.counts),
        "errors": [[op, kind, n] for (op, kind), n in recorder.errors.items()],
        "histograms": recorder.histograms(),   # {series: {op: encoded}}
        "intervals": recorder.intervals(),
        "interval_counts": recorder.interval_counts(),   # [[index, {op: requests}]]
        "connection": connection,
    }


def phase_duration(config, name):
    """Seconds a phase runs (None: its count): a load phase inserts its records whatever
    the run's duration, a warm-up lasts ``config.warmup``."""
    if name == "load":
        return None
    return config.warmup if name == "warmup" else config.duration


def _working(record, seconds):
    """``record`` followed by ``seconds`` of this process's CPU: the application's work
    on each answer (``--client-work``), which no request's latency counts."""
    process_time = time.process_time

    def record_and_work(*args):
        record(*args)
        until = process_time() + seconds
        while process_time() < until:
            pass
    return record_and_work


def runqueue_wait():
    """Seconds the threads of this process have waited on a run queue, ready to run
    (/proc/self/task/*/schedstat); None where the kernel does not say."""
    total = 0
    try:
        for task in os.listdir("/proc/self/task"):
            with open("/proc/self/task/%s/schedstat" % task) as f:
                total += int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return total / 1e9
