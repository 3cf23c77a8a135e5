"""`device_seconds` (tensorfold/cli/bench/timing.py) on a stand-in GPU whose event times the test sets: a hold of the
stream that ended before the host had queued every call is not taken (the figure would hold the host's queueing),
and the run is made again behind a longer hold. The control: holds that are always too short end in an error, not
in a figure."""
import contextlib
import time

import pytest

from tensorfold.cli.bench import timing


class Event:
    def record(self, stream):
        self.recorded = True

    def synchronize(self):
        pass


class StandInCuda:
    """Events whose elapsed times come from `holds` (the hold's milliseconds, one a try) and `run` (the calls')."""

    def __init__(self, holds, run):
        self.holds, self.run, self.events = list(holds), run, []

    def event(self):
        self.events.append(Event())
        return self.events[-1]

    def event_elapsed_time(self, first, second):
        held, start, _ = self.events
        return self.holds.pop(0) if (first, second) == (held, start) else self.run

    def current_context(self):
        class Deallocations:
            disable = staticmethod(contextlib.nullcontext)

        class Context:
            deallocations = Deallocations()
        return Context()


class StandInBackend:
    def __init__(self, cuda):
        self.cuda, self.stream = cuda, object()

    def synchronize(self):
        pass


@pytest.fixture
def holds(monkeypatch):
    """The microseconds each hold was asked for."""
    asked = []

    class Hold:
        def __getitem__(self, config):
            return asked.append
    monkeypatch.setattr(timing, "hold_kernel", lambda: Hold())
    monkeypatch.setattr("tensorfold.serve.memory.on_gpu", lambda backend: True)
    return asked


def slow_launch():
    time.sleep(0.002)  # queueing a call takes the host 2 ms


def test_a_hold_the_host_outlasted_is_made_again_longer(holds):
    cuda = StandInCuda(holds=[1.0, 1000.0], run=30.0)  # the first hold: 1 ms, shorter than 3 calls' queueing
    seconds = timing.device_seconds(StandInBackend(cuda), slow_launch, repeats=3)
    assert seconds == pytest.approx(30.0 / 1000 / 3)
    assert len(holds) == 2 and holds[0] == timing.HOLD_MICROSECONDS and holds[1] >= 2 * timing.HOLD_MICROSECONDS


def test_control_holds_always_too_short_end_in_an_error(holds):
    cuda = StandInCuda(holds=[1.0] * timing.HOLD_TRIES, run=30.0)
    with pytest.raises(RuntimeError, match="longer than every hold"):
        timing.device_seconds(StandInBackend(cuda), slow_launch, repeats=3)
    assert len(holds) == timing.HOLD_TRIES
