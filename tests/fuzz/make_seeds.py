#!/usr/bin/python3
"""Writes the seed corpora of the fuzz harnesses (tests/fuzz/corpus/<name>/).

Each seed is a sequence of records [kind][length][bytes] (see the harness):
for managers_fuzzer, serialized requests that walk one path a real job
takes (a round forming from single and node joins, its key-value bootstrap,
heartbeats, a lost member, completion, and refused requests); for
authenticator_fuzzer, an admin token file, job tokens issued and presented
right and wrong, per-job checks and a restart; for http_routes_fuzzer, GET
requests of every route as every kind of caller, between joins, heartbeats,
completions and time passing. Run from the repository root:
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
    write("managers", seeds)
    write("authenticator", authenticator_seeds(record))
    write("http_routes", http_routes_seeds(record, health_pb2, job_pb2,
                                           rendezvous_pb2))


def write(harness, seeds):
    out = os.path.join("tests/fuzz/corpus", harness)
    os.makedirs(out, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print("make_seeds: wrote %d seeds to %s" % (len(seeds), out))


def authenticator_seeds(record):
    """authenticator_fuzzer's records (see Apply there)."""
    ISSUE, RAW, KNOWN, NONE, AUTHORIZE, RESTART, FLAGS = 0, 1, 3, 4, 5, 6, 7

    def known(secret, how, rest=b""):
        # Secrets are indexed admin first, then current tokens by job id,
        # then replaced ones.
        return record(KNOWN, raw=bytes([secret, how]) + rest)

    return {
        "issue_present_restart": b"".join([
            record(0, raw=b"s3cret-admin-token\n"),  # token mode, its file
            record(ISSUE, raw=b"train"),
            record(ISSUE, raw=b"b"),
            record(ISSUE, raw=b"train"),  # re-issued: the first is replaced
            known(0, 0), known(1, 0), known(2, 0), known(3, 0),
            known(1, 4), known(1, 6, b"\x05"), known(2, 8, b"\x03z"),
            known(0, 1), known(0, 3), known(0, 11),
            record(RAW, raw=b"Bearer "),
            record(RAW, raw=b"Bearer s3cret-admin-token"),
            record(RAW, raw=b"bearer s3cret-admin-token"),
            record(NONE),
            record(AUTHORIZE, raw=b"\x02train"),
            record(AUTHORIZE, raw=b"\x01train"),
            record(AUTHORIZE, raw=b"\x00anything"),
            record(RESTART),
            known(2, 0), known(3, 0),
            record(AUTHORIZE, raw=b"\x01b"),
        ]),
        "auth_off": b"".join([
            record(1, raw=b"ignored"),  # --auth=none
            record(ISSUE, raw=b"a"),
            record(RAW, raw=b"Bearer x"),
            record(NONE),
            record(AUTHORIZE, raw=b"\x00a"),
        ]),
        "token_files": b"".join([
            record(0, raw=b"  two words  "),  # refused: a fixed admin token
            record(FLAGS, raw=b"token\0tok\n"),
            record(FLAGS, raw=b"token\0 \t\n"),
            record(FLAGS, raw=b"none\0x"),
            record(FLAGS, raw=b"token"),
            record(FLAGS, raw=b"none"),
            record(FLAGS, raw=b"tokens\0x"),
            known(0, 0),
        ]),
    }


def http_routes_seeds(record, health_pb2, job_pb2, rendezvous_pb2):
    from google.protobuf import duration_pb2, timestamp_pb2

    """http_routes_fuzzer's records (see Apply there); its coordinator holds
    jobs train (round 1: ranks 0 and 1, incarnations t0 and t1), big (70
    ranks, b0..b69), queued and done."""
    JOIN, HEARTBEATS, COMPLETION, TICK = 4, 5, 6, 7
    NOBODY, ADMIN, TRAIN, BIG, REVOKED, RAW = range(6)

    def get(who, target, header=b""):
        return record(0, raw=bytes([who]) + target +
                      (b"\n" + header if who == RAW else b""))

    def member(job, rank, inc, round=1):
        return health_pb2.MemberRef(job_id=job, round=round, rank=rank,
                                    incarnation_id=inc)

    def join(job, hostname, inc, **config):
        # A one-process job created by its join, with `config`'s fields.
        return record(JOIN, rendezvous_pb2.JoinRequest(
            job_id=job,
            config=job_pb2.JobConfig(job_id=job, min_nodes=1, max_nodes=1,
                                     nproc_per_node=1, **config),
            node=job_pb2.NodeDescriptor(
                hostname=hostname, incarnation_id=inc,
                device_type=job_pb2.DEVICE_TYPE_CPU)))

    admin_routes = [b"/", b"/metrics", b"/api/jobs", b"/api/job?id=train",
                    b"/api/job?id=big",
                    b"/api/job?id=big&members=all&from=3&to=70&limit=5",
                    b"/api/job?id=big&members=unhealthy",
                    b"/api/job?id=queued&members=none",
                    b"/api/job?id=done&members=auto",
                    b"/api/job?id=nope", b"/api/job?id=BAD%20ID",
                    b"/api/job?id=train&limit=-1",
                    b"/api/job?id=train&from=99999999999",
                    b"/api/job?id=train&id=big", b"/api/job", b"/nothing",
                    b"/api/job?members=everyone&id=train"]
    return {
        "routes_admin": b"".join(get(ADMIN, t) for t in admin_routes),
        "routes_callers": b"".join([
            get(TRAIN, b"/metrics"), get(TRAIN, b"/api/jobs"),
            get(TRAIN, b"/api/job?id=train"), get(TRAIN, b"/api/job?id=big"),
            get(BIG, b"/api/job?id=big&members=unhealthy&limit=1"),
            get(REVOKED, b"/api/jobs"), get(NOBODY, b"/"),
            get(NOBODY, b"/api/jobs"), get(NOBODY, b"/api/job?id=train"),
            get(RAW, b"/api/jobs", b"Basic abc"),
            get(RAW, b"/metrics", b"Bearer admin-token-for-the-http-fuzzer"),
            get(RAW, b"/api/jobs", b"Bearer "),
        ]),
        "state_changes": b"".join([
            join("fresh", 'q"\\\n\u00e9', "f0"),
            record(HEARTBEATS, health_pb2.NodeHeartbeatRequest(heartbeats=[
                health_pb2.HeartbeatRequest(
                    member=member("train", 0, "t0"),
                    metrics=job_pb2.WorkerMetrics(
                        step=7, samples_per_second=float("nan"))),
                health_pb2.HeartbeatRequest(member=member("fresh", 0, "f0"))])),
            get(ADMIN, b"/metrics"),
            record(TICK, raw=b"\x14"),
            get(ADMIN, b"/api/job?id=big&members=unhealthy"),
            record(COMPLETION, health_pb2.ReportCompletionRequest(
                member=member("train", 1, "t1"), success=True)),
            get(ADMIN, b"/api/jobs"),
            get(TRAIN, b"/api/job?id=train&members=all"),
        ]),
        # Durations and timestamps out of their documented range (the
        # hostile client test found a job config with one accepted, after
        # which every JSON view of the job failed).
        "malformed_times": b"".join([
            join("odd", "h", "o0",
                 hang_timeout=duration_pb2.Duration(seconds=5, nanos=-1)),
            record(HEARTBEATS, health_pb2.NodeHeartbeatRequest(heartbeats=[
                health_pb2.HeartbeatRequest(
                    member=member("train", 0, "t0"),
                    metrics=job_pb2.WorkerMetrics(
                        step=3, first_bucket_ready=[job_pb2.StepReady(
                            step=3, time=timestamp_pb2.Timestamp(
                                seconds=1, nanos=-7))],
                        round_start=job_pb2.RoundStartTimings(
                            first_step=duration_pb2.Duration(
                                nanos=2000000000))))])),
            get(ADMIN, b"/api/job?id=odd"),
            get(ADMIN, b"/api/job?id=train&members=all"),
            get(ADMIN, b"/api/jobs"),
        ]),
    }


if __name__ == "__main__":
    main()
