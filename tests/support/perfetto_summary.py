"""Reads a Perfetto trace with Perfetto's own generated protos (PyPI `perfetto`) and prints what
the timeline tests assert on, as JSON: the clocks, the tracks (processes, threads, counters),
the perf samples per thread with the leaf of each call stack, and the slices per track with
their durations and annotations.

    python3 perfetto_summary.py TRACE
"""

import collections
import json
import sys

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

trace = pb.Trace()
with open(sys.argv[1], "rb") as f:
    trace.ParseFromString(f.read())

names, functions, frames, callstacks = {}, {}, {}, {}
arg_names, arg_values = {}, {}
tracks, clocks, counters = {}, {}, collections.defaultdict(list)
samples = collections.defaultdict(collections.Counter)
open_slices, slices = {}, []
sequence_cleared = False
for packet in trace.packet:
    if packet.HasField("interned_data"):
        sequence_cleared |= bool(packet.sequence_flags & 1)
        data = packet.interned_data
        names.update({n.iid: n.name for n in data.event_names})
        arg_names.update({n.iid: n.name for n in data.debug_annotation_names})
        arg_values.update({v.iid: v.str.decode() for v in data.debug_annotation_string_values})
        functions.update({f.iid: f.str.decode() for f in data.function_names})
        frames.update({f.iid: f.function_name_id for f in data.frames})
        callstacks.update({c.iid: list(c.frame_ids) for c in data.callstacks})
    kind = packet.WhichOneof("data")
    if kind == "clock_snapshot":
        clocks = {c.clock_id: c.timestamp for c in packet.clock_snapshot.clocks}
    elif kind == "track_descriptor":
        d = packet.track_descriptor
        track = {"uuid": d.uuid, "parent": d.parent_uuid, "name": d.name, "machine": packet.machine_id}
        if d.HasField("thread"):
            track.update(kind="thread", pid=d.thread.pid, tid=d.thread.tid, name=d.thread.thread_name)
        elif d.HasField("process"):
            track.update(kind="process", pid=d.process.pid, name=d.process.process_name)
        elif d.HasField("counter"):
            track.update(kind="counter")
        else:
            track.update(kind="named")
        tracks[d.uuid] = track
    elif kind == "perf_sample":
        s = packet.perf_sample
        stack = callstacks.get(s.callstack_iid, [])
        # Frames are outermost first: the leaf is the last.
        leaf = functions.get(frames.get(stack[-1])) if stack else None
        samples[s.tid][leaf or "[no stack]"] += 1
    elif kind == "track_event":
        e = packet.track_event
        if e.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            args = {
                a.name or arg_names.get(a.name_iid):
                    a.string_value or arg_values.get(a.string_value_iid) or a.uint_value or a.int_value
                for a in e.debug_annotations
            }
            stack = [functions.get(frames.get(f)) for f in callstacks.get(e.callstack_iid, [])]
            open_slices.setdefault(e.track_uuid, []).append((packet.timestamp, names.get(e.name_iid), args, stack))
        elif e.type == pb.TrackEvent.TYPE_SLICE_END:
            begin, name, args, stack = open_slices[e.track_uuid].pop()
            slices.append({"track": e.track_uuid, "name": name, "ns": packet.timestamp - begin,
                           "args": args, "stack": stack})
        elif e.type == pb.TrackEvent.TYPE_COUNTER:
            counters[e.track_uuid].append(e.double_counter_value)

print(json.dumps({
    "clocks": sorted(clocks),
    "sequence_cleared": sequence_cleared,
    "tracks": list(tracks.values()),
    "samples": {str(tid): dict(leaves) for tid, leaves in samples.items()},
    "slices": slices,
    "unclosed": sum(len(v) for v in open_slices.values()),
    "counters": {str(uuid): values for uuid, values in counters.items()},
}))
