"""Host lists and job layouts (tf_bps/launch/hosts.py), without starting anything."""

import pytest

from tf_bps.launch.hosts import Host, HostError, parse_hosts, plan_layout, read_hostfile
from tf_bps.runtime import core
from tf_bps.runtime.server_shares import server_shares


def _roles(layout):
    return [(h.name, h.scheduler, h.servers, h.worker_id, h.workers) for h in layout.hosts]


def test_host_lists_read_as_horovodrun_and_open_mpi_write_them(tmp_path):
    assert parse_hosts("a:4,b:4, 10.0.0.3") == [Host("a", 4), Host("b", 4), Host("10.0.0.3", 1)]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# workers\na slots=2\nb:2  # second\n\nc\n")
    assert read_hostfile(str(hostfile)) == [Host("a", 2), Host("b", 2), Host("c", 1)]
    hostfile.write_text("a slots=2 extra\n")
    with pytest.raises(HostError, match="line 1: 'a slots=2 extra' is not"):
        read_hostfile(str(hostfile))
    with pytest.raises(HostError, match="'a;b' is not a host name"):
        parse_hosts("a;b:2")


def test_workers_fill_hosts_in_order_and_servers_are_dealt_over_them():
    layout = plan_layout([Host("a", 2), Host("b", 2), Host("c", 2)], num_workers=4)
    assert (layout.num_worker_hosts, layout.local_size, layout.num_servers) == (2, 2, 2)
    # c gets no workers; one server per worker host; the scheduler on the first host.
    assert _roles(layout) == [("a", True, 1, 0, 2), ("b", False, 1, 1, 2)]
    layout = plan_layout([Host("a", 1), Host("b", 1)], num_servers=3)
    assert _roles(layout) == [("a", True, 2, 0, 1), ("b", False, 1, 1, 1)]


def test_server_hosts_hold_the_servers():
    layout = plan_layout([Host("a", 2), Host("b", 2)], server_hosts=[Host("s1", 2), Host("s2", 1)])
    assert layout.num_servers == 3
    assert _roles(layout) == [("a", True, 0, 0, 2), ("b", False, 0, 1, 2),
                              ("s1", False, 2, None, 0), ("s2", False, 1, None, 0)]
    layout = plan_layout([Host("a", 1)], num_servers=3, server_hosts=[Host("s1", 1), Host("s2", 1)])
    assert [h.servers for h in layout.hosts] == [0, 2, 1]


def test_server_hosts_may_include_worker_hosts_for_the_hybrid_layout():
    # BytePS's hybrid layout: a server on every worker host plus server-only hosts.
    layout = plan_layout([Host("a", 1), Host("b", 1)],
                         server_hosts=[Host("a", 1), Host("b", 1), Host("s", 1)])
    assert _roles(layout) == [("a", True, 1, 0, 1), ("b", False, 1, 1, 1),
                              ("s", False, 1, None, 0)]


def test_the_hybrid_layout_splits_partitions_as_the_byteps_paper_does():
    # n = 4 worker hosts, k = 2 server-only hosts: x = 2/20 per worker host, y = 6/20.
    assert server_shares(list("abcdst"), list("abcd")) == [1, 1, 1, 1, 3, 3]
    # Each host's share is divided among its servers; the order is the servers'.
    assert server_shares(list("sabab"), list("ab")) == [4, 1, 1, 1, 1]
    # k >= n: the worker hosts' servers get nothing.
    assert server_shares(list("abst"), list("ab")) == [0, 0, 1, 1]
    # Every other layout splits evenly (the core's default).
    assert server_shares(list("ab"), list("ab")) == []  # colocated
    assert server_shares(list("st"), list("ab")) == []  # separate
    assert server_shares(list("as"), list("ab")) == []  # b has no server
    assert server_shares(list("as"), list("a")) == []  # one worker host


@pytest.mark.parametrize("shares", [[1, -1], [0, 0], [1, 1001], [-5, 2]])
def test_the_core_refuses_shares_it_cannot_use(shares):
    engine = core.worker_engine()
    text = ",".join(map(str, shares))
    with pytest.raises(Exception, match=f"bad server shares '{text}': want 2 integers"):
        engine.init(0, 1, [("127.0.0.1", 1, False), ("127.0.0.1", 2, False)], "token",
                    server_shares=shares)


@pytest.mark.parametrize("shares", [[1], [1, 1, 1]])
def test_the_binding_wants_one_share_per_server(shares):
    with pytest.raises(ValueError, match="one per server"):
        core.worker_engine().init(0, 1, [("127.0.0.1", 1, False), ("127.0.0.1", 2, False)],
                                  "token", server_shares=shares)


@pytest.mark.parametrize("servers, problem", [
    ([], "the server list is empty"),
    ([("", 1, False)], "bad address of server 0"),
    ([("127.0.0.1", 0, False)], "bad address of server 0"),
    ([("127.0.0.1", 1, False), ("h", 70000, True)], "bad address of server 1"),
])
def test_the_core_refuses_bad_server_addresses(servers, problem):
    with pytest.raises(Exception, match=problem):
        core.worker_engine().init(0, 1, servers, "token")


def test_the_core_refuses_local_ranks_out_of_order():
    with pytest.raises(Exception, match="local ranks must ascend"):
        core.worker_engine().init(0, 2, [("127.0.0.1", 1, False)], "token",
                                  local_ranks=[1, 0])


def test_layouts_that_cannot_work_are_refused():
    with pytest.raises(HostError, match="same number of workers.*a:2, b:1"):
        plan_layout([Host("a", 2), Host("b", 2)], num_workers=3)
    with pytest.raises(HostError, match="--num-servers must be at least 1"):
        plan_layout([Host("a", 2)], num_servers=0)
