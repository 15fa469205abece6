"""ferry's exceptions and names as Python users expect them: one class per
kind under ``tensorferry.FerryError`` (a timeout is also a ``TimeoutError``), the
kinds and codes from the Rust core's one table, keyword-only constructors,
the native classes named as the Python ones, ``stats()`` typed."""

import pickle
import tempfile
import warnings

import pytest

import tensorferry
from tensorferry import _errors, _native


@pytest.fixture
def ipc():
    """ipc:// endpoints in a directory of their own, removed after."""
    with tempfile.TemporaryDirectory(prefix="ferry-py-") as d:
        yield lambda name: f"ipc://{d}/{name}"


def test_every_kind_of_the_native_table_has_its_class():
    assert set(_errors.ERROR_CLASSES) == set(_native.ERROR_KINDS)
    assert len(_native.ERROR_KINDS) == len(set(_native.ERROR_KINDS))
    for kind in _native.ERROR_KINDS:
        e = _errors.error_for(f"it failed ({kind})", kind)
        assert type(e) is _errors.ERROR_CLASSES[kind] and e.kind == kind
        assert isinstance(e, tensorferry.FerryError) and isinstance(e, RuntimeError)
        assert str(e) == f"it failed ({kind})"
        # Every class is exported by ferry under its own name, and says so.
        assert getattr(tensorferry, type(e).__name__) is type(e) and type(e).__module__ == "tensorferry"
        assert pickle.loads(pickle.dumps(e)).args == e.args
    # A kind this package does not know still raises a FerryError with it.
    e = _errors.error_for("from a newer module", "newfangled")
    assert type(e) is tensorferry.FerryError and e.kind == "newfangled"


def test_the_codes_are_the_cores():
    assert tensorferry.ERROR_CODES == dict(_native.FAULT_CODES)
    assert set(tensorferry.ERROR_CODES) <= set(_native.ERROR_KINDS)
    # sglang's contract: 0 is success, every failure negative, -1 the catch-all.
    assert all(code < 0 for code in tensorferry.ERROR_CODES.values())
    assert len(set(tensorferry.ERROR_CODES.values())) == len(tensorferry.ERROR_CODES)
    assert tensorferry.ERROR_CODES["io"] == -1
    # The values this package always had.
    assert tensorferry.ERROR_CODES == {
        "io": -1, "unknown_peer": -2, "out_of_bounds": -3, "peer_gone": -4,
        "timeout": -5, "too_large": -6, "registration": -7,
    }


def test_builtin_families_catch_their_kinds():
    with pytest.raises(TimeoutError):
        raise _errors.error_for("waited", "timeout")
    with pytest.raises(ConnectionError):
        raise _errors.error_for("gone", "peer_gone")
    with pytest.raises(OSError):
        raise _errors.error_for("errno 5", "io")
    assert isinstance(tensorferry.FerryTimeoutError("x"), tensorferry.FerryError)
    assert not isinstance(tensorferry.RefusedError("x"), OSError)
    # The old spelling still makes a FerryError of a kind.
    assert tensorferry.FerryError("x", "timeout").kind == "timeout"


def test_an_unanswered_registration_is_a_timeout(ipc):
    # Nobody listens at the coordinator's endpoint.
    inst = tensorferry.Instance("encoder", coordinator=ipc("nobody"), endpoint=ipc("enc"))
    try:
        with pytest.raises(TimeoutError, match="not registered") as e:
            inst.wait_registered(0.3)
        assert isinstance(e.value, tensorferry.FerryTimeoutError) and e.value.kind == "timeout"
    finally:
        inst.close()


def test_constructors_take_keywords_only(ipc):
    with pytest.raises(TypeError):
        tensorferry.Instance("encoder", ipc("co"), ipc("enc"))
    with pytest.raises(TypeError):
        tensorferry.Coordinator([ipc("a"), ipc("b"), ipc("c")])
    with pytest.raises(TypeError):
        tensorferry.Coordinator([ipc("a")], ["encoder"])
    with pytest.raises(TypeError):
        _native.InstanceNode("encoder", ipc("co"), ipc("enc"))
    with pytest.raises(TypeError):
        _native.CoordinatorNode([ipc("a")], ["encoder"])


def test_native_classes_have_the_python_names():
    for name in ("Staging", "Delivery", "InstanceNode", "CoordinatorNode", "TransferEngine"):
        assert getattr(_native, name).__name__ == name
    for old in ("Staged", "Received"):
        assert not hasattr(_native, old)


def test_stats_have_the_typed_keys(ipc):
    co = tensorferry.Coordinator(endpoints=[ipc("e"), ipc("d"), ipc("x")])
    enc = tensorferry.Instance("encoder", coordinator=co.endpoint_of("encoder"), endpoint=ipc("enc"))
    try:
        enc.wait_registered(10)
        stats = enc.stats()
        assert set(stats) == set(tensorferry.InstanceStats.__annotations__)
        assert all(isinstance(v, int) for v in stats.values())
        figures = co.stats()
        assert set(figures) == set(tensorferry.CoordinatorStats.__annotations__)
        assert figures["members"] == 1
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert co.snapshot() == co.stats()
        assert any(issubclass(w.category, DeprecationWarning) for w in caught)
    finally:
        enc.close()
        co.close()
