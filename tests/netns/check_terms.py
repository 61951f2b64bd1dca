"""The fault harness's check that no two coordinator replicas served at once,
per acknowledged call: every key-value answer of a replica under etcd
leadership names its term and when it was sent (common/leader_term.h;
gradsync-sim-worker --kv_checks prints them, "kv ack: get term 7 at US"),
and every replica logs when its term began ("term 7 began at unix
microseconds US"). No answer of a term may be sent after a newer term
began.

    check_terms.py KV_LOG REPLICA_LOG...

Prints the verdict; exits 1 naming the first answers past their term, or
when no answer named a term (nothing was checked).
"""
import re
import sys

ACK = re.compile(r"^kv ack: (\w+) term (\d+) at (\d+)$")
BEGAN = re.compile(r"term (\d+) began at unix microseconds (\d+)")


def main(kv_log, replica_logs):
    began = {}
    for path in replica_logs:
        with open(path, errors="replace") as f:
            for line in f:
                m = BEGAN.search(line)
                if m:
                    began[int(m.group(1))] = int(m.group(2))
    acks = []
    with open(kv_log, errors="replace") as f:
        for line in f:
            m = ACK.match(line.strip())
            if m:
                acks.append((m.group(1), int(m.group(2)), int(m.group(3))))
    if not acks:
        print("terms: no answer named a term: nothing checked")
        return 1
    late = []
    for what, term, at in acks:
        if term not in began:
            late.append(f"{what} of term {term}, a term no replica logged")
            continue
        newer = [(t, b) for t, b in began.items() if t > term and b <= at]
        if newer:
            t, b = min(newer)
            late.append(f"{what} of term {term} sent {(at - b) / 1000:.1f} ms "
                        f"after term {t} began")
    per_term = {}
    for _, term, _ in acks:
        per_term[term] = per_term.get(term, 0) + 1
    shares = ", ".join(f"term {t}: {n}" for t, n in sorted(per_term.items()))
    print(f"terms: {len(acks)} answers ({shares}); terms began: "
          f"{', '.join(str(t) for t in sorted(began))}; "
          f"{len(late)} sent after a newer term began")
    for entry in late[:5]:
        print(f"terms: LATE: {entry}")
    return 1 if late else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
