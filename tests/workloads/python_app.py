"""Python workloads for sysprof's Python frames (tests/python.rs), each a mode:

  phases SECONDS TIMING   four functions of different shares; writes each one's own CPU time
                          (thread_time, so only what the workload really got) to TIMING as JSON
  sleep COUNT MS          napper sleeps COUNT times MS milliseconds
  spin SECONDS            spin_main spins (a process traced with --pid)
  threads SECONDS         two pool threads run thread_work while the main thread waits
  children SECONDS        a multiprocessing child runs child_work
  gil SECONDS             two threads run pure Python: each waits for the GIL in turn
  cuda LIBCUDART COUNT    load_batch copies through NVIDIA's libcudart (ctypes), train_step syncs
  bench N                 N calls of a small function, then prints elapsed_ns= (cargo xtask bench)
"""

import json
import sys
import time


def regex_phase(n):
    import re

    pattern = re.compile(r"(\w+)@(\w+)\.com")
    text = "alice@example.com bob@test.com " * 50
    for _ in range(n):
        pattern.findall(text)


def json_phase(n):
    import json as codec

    document = {"a": list(range(100)), "b": {"c": "x" * 50}}
    for _ in range(n):
        codec.loads(codec.dumps(document))


def sort_phase(n):
    import random

    generator = random.Random(1)
    numbers = [generator.random() for _ in range(2000)]
    for _ in range(n):
        sorted(numbers)


def pure_phase(n):
    total = 0
    for i in range(n):
        total += i * i
    return total


def phases(seconds, timing_path):
    spent = {"regex_phase": 0.0, "json_phase": 0.0, "sort_phase": 0.0, "pure_phase": 0.0}
    work = [(regex_phase, 150), (json_phase, 200), (sort_phase, 60), (pure_phase, 150000)]
    # Phases of varying length in varying order: a profiler sampling at a fixed period cannot
    # fall in step with them.
    import random

    chance = random.Random(7)
    start = time.thread_time()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        chance.shuffle(work)
        for function, n in work:
            before = time.thread_time()
            function(max(1, int(n * chance.uniform(0.2, 1.0))))
            spent[function.__name__] += time.thread_time() - before
    spent["total"] = time.thread_time() - start
    with open(timing_path, "w") as out:
        json.dump(spent, out)


def napper(count, ms):
    for _ in range(count):
        time.sleep(ms / 1000)


def spin_main(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pure_phase(10000)


def thread_work(seconds):
    spin_main(seconds)


def threads(seconds):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(thread_work, seconds) for _ in range(2)]:
            future.result()


def child_work(seconds):
    spin_main(seconds)


def children(seconds):
    import multiprocessing

    child = multiprocessing.get_context("fork").Process(target=child_work, args=(seconds,))
    child.start()
    child.join()


def gil_worker(seconds):
    spin_main(seconds)


def gil(seconds):
    import threading

    workers = [threading.Thread(target=gil_worker, args=(seconds,)) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def load_batch(cudart, count):
    import ctypes

    host = ctypes.create_string_buffer(4096)
    device = ctypes.c_void_p(0)
    for _ in range(count):
        # cudaMemcpyHostToDevice; fails without a GPU, after the probe has seen it.
        cudart.cudaMemcpy(device, host, ctypes.c_size_t(4096), 1)


def train_step(cudart):
    cudart.cudaDeviceSynchronize()


def cuda(library, count):
    import ctypes

    cudart = ctypes.CDLL(library)
    # A library loaded mid-run is probed within the tracer's next look at the maps.
    time.sleep(1)
    load_batch(cudart, count)
    train_step(cudart)
    # Code objects are read from the process's memory when a stack with them is first seen: one
    # that exits within milliseconds of its last new stack leaves those frames unnamed (the
    # report's limitations count them). This test is about naming, so the process stays.
    time.sleep(0.3)


def step(i):
    return (i * 7) % 13


def bench(n):
    start = time.perf_counter_ns()
    total = 0
    for i in range(n):
        total += step(i)
    print(f"elapsed_ns={time.perf_counter_ns() - start}")


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "phases":
        phases(float(args[0]), args[1])
    elif mode == "sleep":
        napper(int(args[0]), float(args[1]))
    elif mode == "spin":
        spin_main(float(args[0]))
    elif mode == "threads":
        threads(float(args[0]))
    elif mode == "children":
        children(float(args[0]))
    elif mode == "gil":
        gil(float(args[0]))
    elif mode == "cuda":
        cuda(args[0], int(args[1]))
    elif mode == "bench":
        bench(int(args[0]))
    else:
        sys.exit(f"unknown mode {mode}")
