"""Both backends implement the written protocol (tensorfold/backends/ops.py) with the same parameters, and what the
callers ask of a backend (`can_record`) decides the graph replay and the "auto" drafter, never its name. Each check
is also run on a planted stand-in that breaks it."""
import inspect
from types import SimpleNamespace

import pytest

from tensorfold.backends import CudaBackend, DeviceOps, NumpyBackend, Ops
from tensorfold.drafters import auto_drafter
from tensorfold.model.replay import replays_decode_rounds

MISSING = object()


def parameters(member) -> list:
    """A method's parameters after self (a staticmethod's all of them): name, kind and default each."""
    if isinstance(member, staticmethod):
        listed = list(inspect.signature(member.__func__).parameters.values())
    else:
        listed = list(inspect.signature(member).parameters.values())[1:]
    return [(p.name, p.kind, p.default) for p in listed]


def protocol_members(protocol) -> tuple:
    """(methods: name -> parameters, attributes: name -> annotation) of a protocol and the protocols it extends."""
    methods, attributes = {}, {}
    protocols = [c for c in protocol.__mro__ if getattr(c, "_is_protocol", False) and c.__module__ != "typing"]
    for cls in reversed(protocols):  # the base protocol first, so that an extension's members come after
        attributes.update(inspect.get_annotations(cls))
        methods.update({name: parameters(member) for name, member in vars(cls).items()
                        if not name.startswith("_") and callable(member)})
    return methods, attributes


def departures(target, protocol) -> list:
    """How `target` (a class, or an instance for attributes set in __init__) departs from the protocol."""
    methods, attributes = protocol_members(protocol)
    found = []
    for name, expected in methods.items():
        member = inspect.getattr_static(target, name, MISSING)
        if member is MISSING:
            found.append(f"no method {name}")
        elif parameters(member) != expected:
            found.append(f"{name}: parameters {parameters(member)} instead of {expected}")
    for name, annotation in attributes.items():
        value = inspect.getattr_static(target, name, MISSING)
        if value is MISSING:
            found.append(f"no attribute {name}")
        elif annotation in (bool, str) and not isinstance(value, annotation):
            found.append(f"{name}: {value!r} is not a {annotation.__name__}")
    return found


def test_protocol_lists_every_method_with_a_docstring():
    methods, attributes = protocol_members(DeviceOps)
    assert {"linear", "deltanet_scan", "attention_partial", "side_by_side", "mapped"} <= set(methods)
    assert {"name", "can_record", "on_device", "stream"} <= set(attributes)
    for name in methods:
        doc = getattr(DeviceOps, name).__doc__
        assert doc and "\n" not in doc.strip(), f"{name}: a one-line docstring"


@pytest.mark.parametrize("backend", [NumpyBackend, CudaBackend])
def test_both_backends_implement_the_protocol(backend):
    assert departures(backend, Ops) == []


def test_the_cuda_backend_has_what_a_recording_needs():
    assert departures(CudaBackend(), DeviceOps) == []  # in the simulator without --gpu
    assert CudaBackend.can_record and CudaBackend.on_device
    assert not NumpyBackend.can_record and not NumpyBackend.on_device
    assert departures(NumpyBackend(), DeviceOps)  # it records nothing: no stream, no mapped memory


def test_control_a_stand_in_that_departs_fails_the_check():
    """Planted: NumpyBackend's members with one method left out, one parameter renamed, one default changed, and
    the flag `can_record` left out: each is caught, by name."""
    members = dict(vars(NumpyBackend))
    assert departures(type("Whole", (), members), Ops) == []  # the stand-in as built, before any change
    lacking = type("Lacking", (), {k: v for k, v in members.items() if k != "kv_write"})
    assert departures(lacking, Ops) == ["no method kv_write"]
    renamed = type("Renamed", (), {**members, "copy_into": lambda self, dst, source: None})
    assert [d.split(":")[0] for d in departures(renamed, Ops)] == ["copy_into"]
    defaulted = type("Defaulted", (), {**members, "reserve_rows": lambda self, buffer, length, needed, limit=0: None})
    assert [d.split(":")[0] for d in departures(defaulted, Ops)] == ["reserve_rows"]
    unflagged = type("Unflagged", (), {k: v for k, v in members.items() if k != "can_record"})
    assert departures(unflagged, Ops) == ["no attribute can_record"]


def test_replay_follows_can_record(monkeypatch):
    """Replay only on a backend that can record, unless graphs are off. Control: a stand-in backend named "cuda"
    that cannot record does not replay, so the name decides nothing."""
    recorder, host = SimpleNamespace(name="numpy", can_record=True), NumpyBackend()
    named_cuda = SimpleNamespace(name="cuda", can_record=False)
    monkeypatch.delenv("TENSORFOLD_GRAPHS", raising=False)
    assert replays_decode_rounds(recorder) and not replays_decode_rounds(recorder, graphs=False)
    assert not replays_decode_rounds(host) and not replays_decode_rounds(named_cuda)
    monkeypatch.setenv("TENSORFOLD_GRAPHS", "0")
    assert not replays_decode_rounds(recorder) and replays_decode_rounds(recorder, graphs=True)


def test_auto_drafter_is_the_models_own_else_ngram(tmp_path):
    """"auto" names the model's own drafter folder when it has one (a config.json inside), else "ngram", whatever
    the backend (the engine's gate then decides which rounds draft); "none" without a model. Control: a drafter
    folder without its config is not taken."""
    def model(path):
        return SimpleNamespace(path=str(path), backend=NumpyBackend())
    own = tmp_path / "with" / "drafter"
    own.mkdir(parents=True)
    assert auto_drafter(model(own.parent)) == "ngram"  # the control: no config.json yet
    (own / "config.json").write_text("{}")
    assert auto_drafter(model(own.parent)) == str(own)
    assert auto_drafter(model(tmp_path)) == "ngram"
    assert auto_drafter(None) == "none"
