//! The part of Perfetto's trace format (`protos/perfetto/trace/perfetto_trace.proto`) that
//! `timeline.pftrace` uses, as prost messages: the field numbers are Perfetto's, and the test
//! of the timeline parses the file with Perfetto's own generated protos (PyPI `perfetto`).
//!
//! Written out here rather than taken from a crate: the one crate of Perfetto's generated
//! types (`perfetto_protos`) is rust-protobuf over the whole format, a second protobuf runtime
//! beside prost (which the pprof files use) and a protoc run at build time, for the twenty
//! messages a timeline needs.

use prost::Message;

// A trace file is the `Trace` message, `repeated TracePacket packet = 1`: packets written one
// after another as field 1 (`prost::encoding::message::encode(1, ..)`), which is how sysprof
// writes and reads them, one at a time.

#[derive(Clone, PartialEq, Message)]
pub struct TracePacket {
    #[prost(uint64, optional, tag = "8")]
    pub timestamp: Option<u64>,
    #[prost(uint32, optional, tag = "58")]
    pub timestamp_clock_id: Option<u32>,
    #[prost(uint32, optional, tag = "10")]
    pub trusted_packet_sequence_id: Option<u32>,
    #[prost(message, optional, tag = "12")]
    pub interned_data: Option<InternedData>,
    #[prost(uint32, optional, tag = "13")]
    pub sequence_flags: Option<u32>,
    #[prost(message, optional, tag = "59")]
    pub trace_packet_defaults: Option<TracePacketDefaults>,
    /// The machine the packet comes from, in a trace of several (`sysprof merge`).
    #[prost(uint32, optional, tag = "98")]
    pub machine_id: Option<u32>,
    #[prost(oneof = "Data", tags = "2, 6, 11, 60, 66")]
    pub data: Option<Data>,
}

/// `TracePacket.sequence_flags`.
pub const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;

/// `BuiltinClock`.
pub mod clock {
    pub const REALTIME: u32 = 1;
    pub const MONOTONIC: u32 = 3;
    pub const BOOTTIME: u32 = 6;
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Data {
    #[prost(message, tag = "2")]
    ProcessTree(ProcessTree),
    #[prost(message, tag = "6")]
    ClockSnapshot(ClockSnapshot),
    #[prost(message, tag = "11")]
    TrackEvent(TrackEvent),
    #[prost(message, tag = "60")]
    TrackDescriptor(TrackDescriptor),
    #[prost(message, tag = "66")]
    PerfSample(PerfSample),
}

#[derive(Clone, PartialEq, Message)]
pub struct TracePacketDefaults {
    #[prost(uint32, optional, tag = "58")]
    pub timestamp_clock_id: Option<u32>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ClockSnapshot {
    #[prost(message, repeated, tag = "1")]
    pub clocks: Vec<Clock>,
    #[prost(uint32, optional, tag = "2")]
    pub primary_trace_clock: Option<u32>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Clock {
    #[prost(uint32, optional, tag = "1")]
    pub clock_id: Option<u32>,
    #[prost(uint64, optional, tag = "2")]
    pub timestamp: Option<u64>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ProcessTree {
    #[prost(message, repeated, tag = "1")]
    pub processes: Vec<ProcessTreeProcess>,
    #[prost(message, repeated, tag = "2")]
    pub threads: Vec<ProcessTreeThread>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ProcessTreeProcess {
    #[prost(int32, optional, tag = "1")]
    pub pid: Option<i32>,
    #[prost(int32, optional, tag = "2")]
    pub ppid: Option<i32>,
    #[prost(string, repeated, tag = "3")]
    pub cmdline: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ProcessTreeThread {
    #[prost(int32, optional, tag = "1")]
    pub tid: Option<i32>,
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
    #[prost(int32, optional, tag = "3")]
    pub tgid: Option<i32>,
}

#[derive(Clone, PartialEq, Message)]
pub struct TrackDescriptor {
    #[prost(uint64, optional, tag = "1")]
    pub uuid: Option<u64>,
    #[prost(uint64, optional, tag = "5")]
    pub parent_uuid: Option<u64>,
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
    #[prost(message, optional, tag = "3")]
    pub process: Option<ProcessDescriptor>,
    #[prost(message, optional, tag = "4")]
    pub thread: Option<ThreadDescriptor>,
    #[prost(message, optional, tag = "8")]
    pub counter: Option<CounterDescriptor>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ProcessDescriptor {
    #[prost(int32, optional, tag = "1")]
    pub pid: Option<i32>,
    #[prost(string, repeated, tag = "2")]
    pub cmdline: Vec<String>,
    #[prost(string, optional, tag = "6")]
    pub process_name: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ThreadDescriptor {
    #[prost(int32, optional, tag = "1")]
    pub pid: Option<i32>,
    #[prost(int32, optional, tag = "2")]
    pub tid: Option<i32>,
    #[prost(string, optional, tag = "5")]
    pub thread_name: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct CounterDescriptor {
    /// `CounterDescriptor.Unit`.
    #[prost(int32, optional, tag = "3")]
    pub unit: Option<i32>,
    #[prost(string, optional, tag = "6")]
    pub unit_name: Option<String>,
}

/// `CounterDescriptor.Unit`.
pub mod unit {
    pub const COUNT: i32 = 2;
    pub const SIZE_BYTES: i32 = 3;
}

#[derive(Clone, PartialEq, Message)]
pub struct TrackEvent {
    /// `TrackEvent.Type`.
    #[prost(int32, optional, tag = "9")]
    pub r#type: Option<i32>,
    #[prost(uint64, optional, tag = "11")]
    pub track_uuid: Option<u64>,
    #[prost(string, repeated, tag = "22")]
    pub categories: Vec<String>,
    #[prost(uint64, optional, tag = "10")]
    pub name_iid: Option<u64>,
    #[prost(string, optional, tag = "23")]
    pub name: Option<String>,
    #[prost(int64, optional, tag = "30")]
    pub counter_value: Option<i64>,
    #[prost(double, optional, tag = "44")]
    pub double_counter_value: Option<f64>,
    #[prost(message, repeated, tag = "4")]
    pub debug_annotations: Vec<DebugAnnotation>,
    /// An interned call stack: where a wait blocked, where a call was made.
    #[prost(uint64, optional, tag = "56")]
    pub callstack_iid: Option<u64>,
}

/// `TrackEvent.Type`.
pub mod event_type {
    pub const SLICE_BEGIN: i32 = 1;
    pub const SLICE_END: i32 = 2;
    pub const INSTANT: i32 = 3;
    pub const COUNTER: i32 = 4;
}

#[derive(Clone, PartialEq, Message)]
pub struct DebugAnnotation {
    /// Interned in `InternedData.debug_annotation_names`.
    #[prost(uint64, optional, tag = "1")]
    pub name_iid: Option<u64>,
    #[prost(oneof = "Value", tags = "3, 4, 17")]
    pub value: Option<Value>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Value {
    #[prost(uint64, tag = "3")]
    Uint(u64),
    #[prost(int64, tag = "4")]
    Int(i64),
    /// Interned in `InternedData.debug_annotation_string_values`.
    #[prost(uint64, tag = "17")]
    StringIid(u64),
}

#[derive(Clone, PartialEq, Message)]
pub struct PerfSample {
    #[prost(uint32, optional, tag = "1")]
    pub cpu: Option<u32>,
    #[prost(uint32, optional, tag = "2")]
    pub pid: Option<u32>,
    #[prost(uint32, optional, tag = "3")]
    pub tid: Option<u32>,
    #[prost(uint64, optional, tag = "4")]
    pub callstack_iid: Option<u64>,
}

#[derive(Clone, PartialEq, Message)]
pub struct InternedData {
    #[prost(message, repeated, tag = "2")]
    pub event_names: Vec<EventName>,
    /// `DebugAnnotationName`, which has the fields of `EventName`.
    #[prost(message, repeated, tag = "3")]
    pub debug_annotation_names: Vec<EventName>,
    #[prost(message, repeated, tag = "29")]
    pub debug_annotation_string_values: Vec<InternedString>,
    #[prost(message, repeated, tag = "5")]
    pub function_names: Vec<InternedString>,
    #[prost(message, repeated, tag = "6")]
    pub frames: Vec<Frame>,
    #[prost(message, repeated, tag = "7")]
    pub callstacks: Vec<Callstack>,
    #[prost(message, repeated, tag = "17")]
    pub mapping_paths: Vec<InternedString>,
    #[prost(message, repeated, tag = "19")]
    pub mappings: Vec<Mapping>,
}

#[derive(Clone, PartialEq, Message)]
pub struct EventName {
    #[prost(uint64, optional, tag = "1")]
    pub iid: Option<u64>,
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct InternedString {
    #[prost(uint64, optional, tag = "1")]
    pub iid: Option<u64>,
    #[prost(bytes = "vec", optional, tag = "2")]
    pub str: Option<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Mapping {
    #[prost(uint64, optional, tag = "1")]
    pub iid: Option<u64>,
    #[prost(uint64, repeated, tag = "7")]
    pub path_string_ids: Vec<u64>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Frame {
    #[prost(uint64, optional, tag = "1")]
    pub iid: Option<u64>,
    #[prost(uint64, optional, tag = "2")]
    pub function_name_id: Option<u64>,
    #[prost(uint64, optional, tag = "3")]
    pub mapping_id: Option<u64>,
    #[prost(uint64, optional, tag = "4")]
    pub rel_pc: Option<u64>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Callstack {
    #[prost(uint64, optional, tag = "1")]
    pub iid: Option<u64>,
    /// Outermost first.
    #[prost(uint64, repeated, tag = "2")]
    pub frame_ids: Vec<u64>,
}
