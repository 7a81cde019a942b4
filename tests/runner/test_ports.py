"""reserve_ports keeps to UNDERTOW_PORT_RANGE, and a malformed range names the variable."""

from __future__ import annotations

import pytest

from undertow.platform.ports import PORT_RANGE_ENV, port_range, reserve_ports


def test_ports_come_from_the_range_the_environment_gives(monkeypatch):
    monkeypatch.setenv(PORT_RANGE_ENV, "23000-23100")
    assert port_range() == (23000, 23100)
    ports = reserve_ports(8)
    assert len(set(ports)) == 8
    assert all(23000 <= port < 23100 for port in ports)


@pytest.mark.parametrize("text", ["23000", "a-b", "30000-20000", "80-2000"])
def test_a_malformed_range_is_refused_by_name(monkeypatch, text):
    monkeypatch.setenv(PORT_RANGE_ENV, text)
    with pytest.raises(ValueError, match=PORT_RANGE_ENV):
        port_range()


def test_the_tests_free_port_never_gives_a_port_twice(monkeypatch):
    """A cluster draws its ports one by one before any binds: a port given twice is a
    broker that finds its own controller on its port (tests/ports.py)."""
    import ports

    monkeypatch.setenv(PORT_RANGE_ENV, "23200-23260")
    monkeypatch.setattr(ports, "_HANDED_OUT", set())
    # 20 of the 60: a base range of 4 ports then has 100 draws to find itself free
    # (with 30 drawn, 1 run in about 600 found none).
    drawn = [ports.free_port() for _ in range(20)]
    assert len(set(drawn)) == 20 and all(23200 <= p < 23260 for p in drawn)
    base = ports.free_base_port(2, metrics_offset=4)
    assert not {base, base + 1, base + 4, base + 5} & set(drawn)


def test_a_port_the_caller_holds_is_never_given(monkeypatch):
    """A replaced pod's new port is drawn past the cluster's own, which a killed broker,
    down and unbound, is about to bind again (LocalPlatform._move_listeners)."""
    from undertow.platform.local import _ports_of

    monkeypatch.setenv(PORT_RANGE_ENV, "23300-23310")
    taken = set(range(23300, 23310)) - {23307}
    assert {reserve_ports(1, taken=taken)[0] for _ in range(20)} == {23307}
    argv = ["broker", "--listen", "127.0.0.1:23301", "--metrics-port", "23302",
            "--listener", "CLIENT_C1=127.0.0.1:23303", "--data-dir", "/tmp/x:1"]
    assert _ports_of([argv]) == {23301, 23302, 23303}
