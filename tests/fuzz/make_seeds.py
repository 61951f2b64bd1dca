#!/usr/bin/python3
"""Writes the seed corpus of managers_fuzzer (tests/fuzz/corpus/managers/).

Each seed is a sequence of records [kind][length][serialized request] (see
managers_fuzzer.cc) that walks one path a real job takes: a round forming
from single and node joins, its key-value bootstrap, heartbeats, a lost
member, completion, and refused requests. Run from the repository root:
    /usr/bin/python3 tests/fuzz/make_seeds.py
It needs Debian's protoc and python3-protobuf; the seeds are committed, so
run it only to change them.
"""
import os
import subprocess
import sys
import tempfile

JOIN, JOIN_NODE, LEAVE, SET, GET, ADD, CAS, WAIT, DELETE, LIST = range(10)
CREATE, GET_JOB, HEARTBEATS, COMPLETION, BREAK, TICK = range(10, 16)


def main():
    gen = tempfile.mkdtemp()
    protos = sorted(os.path.join("proto/gradsync/v1", p)
                    for p in os.listdir("proto/gradsync/v1"))
    subprocess.run(["protoc", "-I.", "--python_out=" + gen] + protos,
                   check=True)
    sys.path.insert(0, gen)
    from proto.gradsync.v1 import (health_pb2, job_pb2, jobs_pb2, kv_pb2,
                                   rendezvous_pb2)

    def record(kind, message=None, raw=b""):
        body = message.SerializeToString() if message is not None else raw
        assert len(body) < 256, (kind, len(body))
        return bytes([kind, len(body)]) + body

    def config(job, nodes, nproc=1):
        return job_pb2.JobConfig(job_id=job, min_nodes=nodes, max_nodes=nodes,
                                 nproc_per_node=nproc)

    def node(host, inc):
        return job_pb2.NodeDescriptor(hostname=host, incarnation_id=inc,
                                      pid=7, addresses=["10.0.0.1"],
                                      device_type=job_pb2.DEVICE_TYPE_CPU,
                                      device_count=1)

    def member(job, rank, inc, round=1):
        return health_pb2.MemberRef(job_id=job, round=round, rank=rank,
                                    incarnation_id=inc)

    def scope(job, round=1):
        return kv_pb2.Scope(job_id=job, round=round)

    seeds = {}
    # Two single joins form round 1; its key-value bootstrap; heartbeats;
    # both complete.
    seeds["round_kv_heartbeats"] = b"".join([
        record(JOIN, rendezvous_pb2.JoinRequest(
            job_id="a", config=config("a", 2), node=node("h0", "i0"))),
        record(JOIN, rendezvous_pb2.JoinRequest(
            job_id="a", node=node("h1", "i1"))),
        record(WAIT, kv_pb2.WaitRequest(scope=scope("a"), keys=["id"],
                                        timeout_ms=500)),
        record(SET, kv_pb2.SetRequest(scope=scope("a"), key="id",
                                      value=b"\x00\x01")),
        record(GET, kv_pb2.GetRequest(scope=scope("a"), key="id")),
        record(ADD, kv_pb2.AddRequest(scope=scope("a"), key="n", delta=3)),
        record(CAS, kv_pb2.CompareAndSetRequest(
            scope=scope("a"), key="c", expect_absent=True, desired=b"x")),
        record(LIST, kv_pb2.ListRequest(scope=scope("a"), prefix="")),
        record(DELETE, kv_pb2.DeleteRequest(scope=scope("a"), key="n")),
        record(HEARTBEATS, health_pb2.NodeHeartbeatRequest(heartbeats=[
            health_pb2.HeartbeatRequest(member=member("a", 0, "i0"),
                                        metrics=job_pb2.WorkerMetrics(step=4)),
            health_pb2.HeartbeatRequest(member=member("a", 1, "i1"))])),
        record(GET_JOB, jobs_pb2.GetJobRequest(
            job_id="a", members=jobs_pb2.MemberQuery(page_size=1))),
        record(COMPLETION, health_pb2.ReportCompletionRequest(
            member=member("a", 0, "i0"), success=True)),
        record(COMPLETION, health_pb2.ReportCompletionRequest(
            member=member("a", 1, "i1"), success=True)),
    ])
    # A node of 2 joins in one call; a member goes silent and is lost; the
    # survivor rejoins.
    seeds["node_join_loss"] = b"".join([
        record(JOIN_NODE, rendezvous_pb2.JoinNodeRequest(
            job_id="b", config=config("b", 2, 2), processes=[
                rendezvous_pb2.ProcessJoin(node=node("n0", "p0")),
                rendezvous_pb2.ProcessJoin(node=node("n0", "p1"))])),
        record(JOIN_NODE, rendezvous_pb2.JoinNodeRequest(
            job_id="b", processes=[
                rendezvous_pb2.ProcessJoin(node=node("n1", "p2")),
                rendezvous_pb2.ProcessJoin(node=node("n1", "p3"))])),
        record(HEARTBEATS, health_pb2.NodeHeartbeatRequest(heartbeats=[
            health_pb2.HeartbeatRequest(member=member("b", r, "p%d" % r))
            for r in range(4)])),
        record(TICK, raw=b"\x14"),
        record(HEARTBEATS, health_pb2.NodeHeartbeatRequest(heartbeats=[
            health_pb2.HeartbeatRequest(member=member("b", 0, "p0"))])),
        record(BREAK),
        record(JOIN, rendezvous_pb2.JoinRequest(
            job_id="b", node=node("n0", "p0"), last_round=1, has_state=True,
            committed_step=9)),
        record(TICK, raw=b"\x30"),
    ])
    # A job created ahead, waits that time out, spares, leaves and refusals.
    seeds["create_wait_leave"] = b"".join([
        record(CREATE, jobs_pb2.CreateJobRequest(config=config("c", 1))),
        record(CREATE, jobs_pb2.CreateJobRequest(config=config("c", 1))),
        record(JOIN, rendezvous_pb2.JoinRequest(job_id="c",
                                                node=node("h", "x"))),
        record(JOIN, rendezvous_pb2.JoinRequest(job_id="c",
                                                node=node("h2", "y"))),
        record(LEAVE, rendezvous_pb2.LeaveRequest(job_id="c",
                                                  incarnation_id="y")),
        record(WAIT, kv_pb2.WaitRequest(scope=scope("c"), keys=["never"],
                                        timeout_ms=100)),
        record(TICK, raw=b"\x01"),
        record(SET, kv_pb2.SetRequest(scope=scope("c", 7), key="k")),
        record(JOIN, rendezvous_pb2.JoinRequest(job_id="BAD ID",
                                                node=node("h", "z"))),
        record(GET_JOB, jobs_pb2.GetJobRequest(
            job_id="c", members=jobs_pb2.MemberQuery(rank_from=5,
                                                     rank_to=2))),
        record(COMPLETION, health_pb2.ReportCompletionRequest(
            member=member("c", 0, "x"), success=False, exit_code=3)),
    ])
    out = "tests/fuzz/corpus/managers"
    os.makedirs(out, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print("make_seeds: wrote %d seeds to %s" % (len(seeds), out))


if __name__ == "__main__":
    main()
