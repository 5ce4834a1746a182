//! One Perfetto trace of several hosts: each run's `timeline.pftrace` becomes one machine
//! (`TracePacket.machine_id`) on a sequence of its own, its timestamps moved from its own
//! CLOCK_MONOTONIC to wall-clock time by the offset its clock snapshot recorded at the start,
//! so that the hosts line up as their clocks (NTP or PTP synchronized) do. Its tracks' ids are
//! made unique per host and its processes named with their host and rank.
//!
//! The traces are read and written one packet at a time: a merge of many large timelines costs
//! their bytes, not their decoded messages.

use std::collections::HashMap;

use prost::Message as _;

use crate::{
    gpu::functions::{self, Kind},
    timeline::perfetto::{Clock, ClockSnapshot, Data, TracePacket, clock, event_type},
};

/// One host's timeline, with what the merge reads of it.
pub struct HostTimeline {
    bytes: Vec<u8>,
    /// Wall-clock time minus monotonic time on that host, in nanoseconds.
    pub realtime_offset_ns: i64,
    /// Its NCCL collectives, (start, end) in its monotonic time, in start order.
    pub collectives: Vec<(u64, u64)>,
}

impl HostTimeline {
    pub fn decode(bytes: Vec<u8>) -> anyhow::Result<Self> {
        let mut offset = None;
        let mut names: HashMap<u64, String> = HashMap::new();
        // Per track, the slices begun and not yet ended: (start, whether a collective).
        let mut open: HashMap<u64, Vec<(u64, bool)>> = HashMap::new();
        let mut collectives = Vec::new();
        for packet in packets(&bytes) {
            let packet = packet?;
            if let Some(interned) = &packet.interned_data {
                names.extend(interned.event_names.iter().filter_map(|n| Some((n.iid?, n.name.clone()?))));
            }
            match &packet.data {
                Some(Data::ClockSnapshot(snapshot)) => {
                    let at = |id| {
                        snapshot.clocks.iter().find(|c| c.clock_id == Some(id)).and_then(|c| c.timestamp)
                    };
                    if let (Some(mono), Some(real)) = (at(clock::MONOTONIC), at(clock::REALTIME)) {
                        offset = Some(i64::try_from(i128::from(real) - i128::from(mono)).map_err(|_| {
                            anyhow::anyhow!("its clock snapshot's times are hundreds of years apart")
                        })?);
                    }
                }
                Some(Data::TrackEvent(event)) => {
                    let (Some(track), Some(at)) = (event.track_uuid, packet.timestamp) else { continue };
                    match event.r#type {
                        Some(event_type::SLICE_BEGIN) => {
                            let name = event.name_iid.and_then(|iid| names.get(&iid));
                            let collective = name.is_some_and(|name| is_collective(name));
                            open.entry(track).or_default().push((at, collective));
                        }
                        Some(event_type::SLICE_END) => {
                            if let Some((start, true)) = open.get_mut(&track).and_then(Vec::pop) {
                                collectives.push((start, at));
                            }
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
        }
        collectives.sort_unstable();
        let realtime_offset_ns = offset.ok_or_else(|| anyhow::anyhow!("no clock snapshot"))?;
        Ok(HostTimeline { bytes, realtime_offset_ns, collectives })
    }

    /// A monotonic time of this host in wall-clock nanoseconds.
    pub fn realtime(&self, monotonic_ns: u64) -> u64 {
        // In 128 bits: a file's times are its word, and may be anything.
        (i128::from(monotonic_ns) + i128::from(self.realtime_offset_ns)).clamp(0, i128::from(u64::MAX)) as u64
    }
}

/// Whether a call of this name is an NCCL collective (or point-to-point transfer).
fn is_collective(name: &str) -> bool {
    functions::FUNCTIONS.iter().any(|f| f.name == name && matches!(f.kind, Kind::Collective { .. }))
}

/// The packets of an encoded `Trace`, one at a time: each is field 1, length-delimited.
fn packets(mut bytes: &[u8]) -> impl Iterator<Item = anyhow::Result<TracePacket>> + '_ {
    std::iter::from_fn(move || {
        if bytes.is_empty() {
            return None;
        }
        let next = (|| {
            let key = prost::encoding::decode_varint(&mut bytes)?;
            anyhow::ensure!(key == (1 << 3 | 2), "not a Perfetto trace (field key {key})");
            let len = prost::encoding::decode_varint(&mut bytes)? as usize;
            anyhow::ensure!(len <= bytes.len(), "a packet runs past the end of the file");
            let (packet, rest) = bytes.split_at(len);
            bytes = rest;
            Ok(TracePacket::decode(packet)?)
        })();
        if next.is_err() {
            bytes = &[];
        }
        Some(next)
    })
}

/// The hosts' timelines, each under its label, as one trace.
pub fn merge(hosts: Vec<(&str, HostTimeline)>) -> Vec<u8> {
    let start =
        hosts.iter().filter_map(|(_, host)| host.collectives.first().map(|c| host.realtime(c.0))).min();
    let mut out = Vec::new();
    // The trace's clock is wall-clock time, under the default trace clock's id (so that no
    // packet needs converting, whichever machine it is from).
    let now = start.unwrap_or_else(|| crate::timeline::Clocks::now().realtime_ns);
    let snapshot = TracePacket {
        trusted_packet_sequence_id: Some(u32::MAX),
        data: Some(Data::ClockSnapshot(ClockSnapshot {
            clocks: vec![
                Clock { clock_id: Some(clock::BOOTTIME), timestamp: Some(now) },
                Clock { clock_id: Some(clock::REALTIME), timestamp: Some(now) },
            ],
            primary_trace_clock: Some(clock::BOOTTIME),
        })),
        ..TracePacket::default()
    };
    append(&mut out, &snapshot);
    for (index, (label, host)) in hosts.iter().enumerate() {
        let machine = index as u32 + 1;
        for packet in packets(&host.bytes) {
            // Decoded once already: a packet that fails now cannot.
            let Ok(mut packet) = packet else { break };
            if matches!(packet.data, Some(Data::ClockSnapshot(_))) {
                continue;
            }
            packet.machine_id = Some(machine);
            packet.trusted_packet_sequence_id = Some(machine);
            // Each host's packets are on its monotonic clock (the sequence's default).
            if let Some(at) = packet.timestamp {
                packet.timestamp = Some(host.realtime(at));
                packet.timestamp_clock_id = Some(clock::BOOTTIME);
            }
            if let Some(defaults) = &mut packet.trace_packet_defaults {
                defaults.timestamp_clock_id = Some(clock::BOOTTIME);
            }
            let unique = |uuid: u64| uuid ^ u64::from(machine) << 56;
            match &mut packet.data {
                Some(Data::TrackDescriptor(track)) => {
                    track.uuid = track.uuid.map(unique);
                    track.parent_uuid = track.parent_uuid.map(unique);
                    if let Some(process) = &mut track.process {
                        let name = process.process_name.take().unwrap_or_default();
                        process.process_name = Some(format!("{label}: {name}"));
                    }
                }
                Some(Data::TrackEvent(event)) => event.track_uuid = event.track_uuid.map(unique),
                _ => {}
            }
            append(&mut out, &packet);
        }
    }
    out
}

/// Appends one packet as a field of the `Trace` message.
fn append(out: &mut Vec<u8>, packet: &TracePacket) {
    prost::encoding::message::encode(1, packet, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_figures_a_file_claims_never_wrap() {
        let snapshot = |mono: u64, real: u64| {
            let mut bytes = Vec::new();
            append(
                &mut bytes,
                &TracePacket {
                    data: Some(Data::ClockSnapshot(ClockSnapshot {
                        clocks: vec![
                            Clock { clock_id: Some(clock::MONOTONIC), timestamp: Some(mono) },
                            Clock { clock_id: Some(clock::REALTIME), timestamp: Some(real) },
                        ],
                        primary_trace_clock: None,
                    })),
                    ..TracePacket::default()
                },
            );
            HostTimeline::decode(bytes)
        };
        let host = snapshot(5, 15).unwrap();
        assert_eq!((host.realtime_offset_ns, host.realtime(1)), (10, 11));
        assert!(snapshot(0, u64::MAX).is_err(), "an offset past 64 bits is refused");
        let late = HostTimeline { bytes: Vec::new(), realtime_offset_ns: i64::MAX, collectives: Vec::new() };
        assert_eq!(late.realtime(u64::MAX), u64::MAX);
        let early = HostTimeline { bytes: Vec::new(), realtime_offset_ns: i64::MIN, collectives: Vec::new() };
        assert_eq!(early.realtime(5), 0);
    }
}
