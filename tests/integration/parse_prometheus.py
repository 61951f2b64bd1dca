"""Parses a Prometheus text exposition with python3-prometheus-client.

Usage: parse_prometheus.py FILE
Prints every sample as `name{k=v,...} value` (labels sorted) and exits 0, or
prints the parser's error and exits 1. The coordinator's tests compare the
printed samples with what they expect.
"""
import sys

from prometheus_client.parser import text_string_to_metric_families


def main(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as e:  # the parser raises ValueError and friends
        print(f"parse error: {e!r}")
        return 1
    for family in families:
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            name = f"{sample.name}{{{labels}}}" if labels else sample.name
            print(f"{name} {float(sample.value)!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
