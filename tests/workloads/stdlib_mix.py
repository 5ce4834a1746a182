"""A stdlib-heavy Python workload (regex, json, sort) for the unwinder's test: Debian's python3
has no frame pointers, so its stacks are whole only when walked with unwind tables.

    python3 stdlib_mix.py SECONDS
"""
import json
import random
import re
import sys
import time


def regex_work():
    pattern = re.compile(r"(\w+)@(\w+)\.com")
    text = " ".join(f"user{i}@host{i}.com" for i in range(200))
    for _ in range(20):
        pattern.findall(text)


def json_work():
    document = {"k%d" % i: [i, str(i), {"x": i}] for i in range(300)}
    for _ in range(10):
        json.loads(json.dumps(document))


def sort_work():
    values = [random.random() for _ in range(20000)]
    sorted(values)


def main(seconds):
    end = time.time() + seconds
    while time.time() < end:
        regex_work()
        json_work()
        sort_work()


main(float(sys.argv[1]) if len(sys.argv) > 1 else 2.0)
