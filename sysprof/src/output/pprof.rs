//! pprof files (`cpu.pb.gz`, ...): every stack profile as a gzipped `profile.proto`, which
//! `go tool pprof`, Pyroscope, Parca and speedscope read.
//!
//! The heap is two files: bytes allocated (`alloc`) and bytes live at the end (`inuse`).
//!
//! The message types are libdd-profiling-protobuf's (Datadog's prost types of profile.proto);
//! prost encodes them. Each profile keeps its unit (on-CPU samples with their CPU time at the
//! sampling period, off-CPU nanoseconds, faults, bytes), functions, mappings with their files
//! and build ids, and labels: the process (pid, name), the thread where the kernel kept it (the
//! on-CPU samples), and the label frame sysprof's flamegraphs put under the process (why a
//! thread was off CPU, which kind of fault) as a label instead of a frame.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    io::Write,
    sync::Arc,
};

use flate2::{Compression, write::GzEncoder};
use libdd_profiling_protobuf::prost_impls::{
    Function, Label, Line, Location, Mapping, Message as _, Profile, Sample, ValueType,
};

use super::{Artifact, Rendered, Sink};
use crate::{
    procmaps::Backing,
    procs::ProcessTable,
    profile::{StackProfile, WeightedStack},
    symbolize::Frame,
};

/// What the pprof files need beside the stacks.
#[derive(Debug, Default)]
pub struct ProfileFacts {
    /// When the trace started, in nanoseconds since the epoch.
    pub time_nanos: i64,
    pub duration_nanos: i64,
    /// The on-CPU sampling period in nanoseconds of CPU (cpu-clock at the frequency); `None`
    /// when the samples are of another event.
    pub cpu_period_ns: Option<i64>,
    /// The files behind the modules the frames name.
    pub modules: HashMap<String, ModuleFile>,
}

/// The file a module (a frame's `module`) was mapped from.
#[derive(Clone, Debug, Default)]
pub struct ModuleFile {
    pub path: String,
    /// The GNU build id, in hex, when the file has one.
    pub build_id: Option<String>,
}

/// The files behind the `modules` the frames name, from the processes' mappings, with their
/// build ids: read from the ELF notes (not the whole file) when `read_build_ids`, else those a
/// saved run recorded (`known`: path -> build id).
pub fn module_files(
    modules: &BTreeSet<&str>,
    processes: &ProcessTable,
    read_build_ids: bool,
    known: &BTreeMap<String, String>,
) -> HashMap<String, ModuleFile> {
    let mut files = HashMap::new();
    // Every image's: a module may be of the program a process ran before its exec.
    for maps in processes.iter().flat_map(|(_, record)| record.images().filter_map(|image| image.maps)) {
        for mapping in maps.mappings() {
            let Backing::File { path, open, key } = &mapping.backing else { continue };
            let module = mapping.module_name();
            if !modules.contains(module.as_str()) || files.contains_key(&module) {
                continue;
            }
            let path = path.display().to_string();
            let build_id = if read_build_ids { build_id(open, *key) } else { known.get(&path).cloned() };
            let file = ModuleFile { path, build_id };
            files.insert(module, file);
        }
    }
    files
}

/// The GNU build id of the file a process mapped (see `mapped::open`), in hex.
fn build_id(path: &std::path::Path, key: crate::mapped::FileKey) -> Option<String> {
    use object::Object as _;
    let file = crate::mapped::open(path, Some(key)).ok()?;
    let data = crate::mapped::Bounded::new(&file, crate::mapped::READ_LIMIT);
    let elf = object::File::parse(&data).ok()?;
    let id = elf.build_id().ok()??;
    Some(id.iter().map(|b| format!("{b:02x}")).collect())
}

pub struct Pprof;

impl Sink for Pprof {
    fn render(&self, artifact: &Artifact<'_>) -> anyhow::Result<Option<Rendered>> {
        let Artifact::Stacks { name, title, profile, facts, .. } = artifact else {
            return Ok(None);
        };
        let mut gzip = GzEncoder::new(Vec::new(), Compression::default());
        write(name, title, profile, facts, &mut gzip)?;
        Ok(Some(Rendered { name: format!("{name}.{}", super::PPROF), bytes: gzip.finish()? }))
    }
}

/// The profile `name` as a pprof message, written to `out` a sample at a time: the message
/// whole (its samples' location and label lists, then its encoding) took 6.7 MB for a busy
/// host's fault profile, the peak of the run's end, for a file of 100 KB. A message's fields
/// may come in any order, and a repeated one's entries need not be together, so the samples
/// are written as they are made, and the rest of the message after them.
pub fn write(
    name: &str,
    title: &str,
    profile: &StackProfile,
    facts: &ProfileFacts,
    out: &mut impl Write,
) -> std::io::Result<()> {
    let mut builder = Builder::default();
    let kind = Kind::of(name, &profile.unit, facts.cpu_period_ns);
    let sample_types = kind.sample_types().iter().map(|(t, u)| builder.value_type(t, u)).collect();
    let period_type = kind.period_type().map(|(t, u)| builder.value_type(t, u));
    let comment = vec![builder.string(title)];
    let mut encoded = Vec::new();
    for stack in profile.stacks.iter().filter(|s| s.weight > 0) {
        builder.add_stack(stack, &kind, facts);
        for sample in builder.samples.drain(..) {
            encoded.clear();
            prost::encoding::message::encode(PROFILE_SAMPLE_FIELD, &sample, &mut encoded);
            out.write_all(&encoded)?;
        }
    }
    let default_sample_type = builder.string(kind.sample_types().last().map_or("", |(t, _)| t));
    let rest = Profile {
        sample_types,
        samples: Vec::new(),
        mappings: builder.mappings,
        locations: builder.locations,
        functions: builder.functions,
        string_table: builder.strings,
        drop_frames: 0,
        keep_frames: 0,
        time_nanos: facts.time_nanos,
        duration_nanos: facts.duration_nanos,
        period_type,
        period: kind.period(),
        comment,
        default_sample_type,
    };
    out.write_all(&rest.encode_to_vec())
}

/// `Profile.sample`'s field number in profile.proto.
const PROFILE_SAMPLE_FIELD: u32 = 2;

/// A Python frame's function and line: `train_step (train.py:42)` -> (`train_step`, 42).
fn python_line(frame: &Frame) -> Option<(&str, i64)> {
    if !frame.is_python() {
        return None;
    }
    let (head, line) = frame.function.strip_suffix(')')?.rsplit_once(':')?;
    let (function, _file) = head.rsplit_once(" (")?;
    Some((function, line.parse().ok()?))
}

/// Which measure a profile carries, from its name and unit.
enum Kind {
    /// On-CPU samples: counts and their CPU time at `period` ns each.
    Cpu { period: i64 },
    /// On-CPU samples of an event that is no time.
    Events,
    /// Off-CPU time, weighted in microseconds; the first frame is the reason.
    OffCpu,
    /// Page faults (weighted counts); the first frame is the kind of fault.
    Faults,
    /// Heap bytes allocated.
    Alloc,
    /// Heap bytes live at the end.
    Inuse,
    /// Time in probed calls, in nanoseconds.
    CallTime,
    /// Anything else, in its own unit.
    Other(String),
}

impl Kind {
    fn of(name: &str, unit: &str, cpu_period_ns: Option<i64>) -> Kind {
        match (name, cpu_period_ns) {
            ("cpu", Some(period)) => Kind::Cpu { period },
            ("cpu", None) => Kind::Events,
            ("offcpu", _) => Kind::OffCpu,
            ("faults", _) => Kind::Faults,
            ("alloc", _) => Kind::Alloc,
            ("inuse", _) => Kind::Inuse,
            (crate::gpu::section::CALL_PROFILE, _) => Kind::CallTime,
            _ => Kind::Other(unit.to_string()),
        }
    }

    /// (type, unit) of each value, the preferred one last.
    fn sample_types(&self) -> Vec<(&str, &str)> {
        match self {
            Kind::Cpu { .. } => vec![("samples", "count"), ("cpu", "nanoseconds")],
            Kind::Events => vec![("samples", "count")],
            Kind::OffCpu => vec![("off_cpu", "nanoseconds")],
            Kind::Faults => vec![("faults", "count")],
            Kind::Alloc => vec![("alloc_space", "bytes")],
            Kind::Inuse => vec![("inuse_space", "bytes")],
            Kind::CallTime => vec![("call_time", "nanoseconds")],
            Kind::Other(unit) => vec![("value", unit.as_str())],
        }
    }

    fn period_type(&self) -> Option<(&str, &str)> {
        matches!(self, Kind::Cpu { .. }).then_some(("cpu", "nanoseconds"))
    }

    fn period(&self) -> i64 {
        match self {
            Kind::Cpu { period } => *period,
            _ => 0,
        }
    }

    /// The sample's values for a weight in the profile's unit.
    fn values(&self, weight: u64) -> Vec<i64> {
        let weight = weight as i64;
        match self {
            Kind::Cpu { period } => vec![weight, weight.saturating_mul(*period)],
            Kind::OffCpu => vec![weight.saturating_mul(1000)],
            _ => vec![weight],
        }
    }

    /// The label a leading label frame becomes (`[sleep]` -> reason=sleep).
    fn label_key(&self) -> Option<&'static str> {
        match self {
            Kind::OffCpu => Some("reason"),
            Kind::Faults => Some("fault"),
            _ => None,
        }
    }
}

/// The message under construction: its string table and the ids given so far.
#[derive(Default)]
struct Builder {
    strings: Vec<String>,
    string_ids: HashMap<String, i64>,
    functions: Vec<Function>,
    locations: Vec<Location>,
    location_ids: HashMap<(Arc<str>, Arc<str>), u64>,
    function_ids: HashMap<(String, Arc<str>), u64>,
    mappings: Vec<Mapping>,
    mapping_ids: HashMap<String, u64>,
    samples: Vec<Sample>,
}

impl Builder {
    /// The string's index in the table; index 0 is always "".
    fn string(&mut self, text: &str) -> i64 {
        if self.strings.is_empty() {
            self.strings.push(String::new());
            self.string_ids.insert(String::new(), 0);
        }
        if let Some(id) = self.string_ids.get(text) {
            return *id;
        }
        let id = self.strings.len() as i64;
        self.strings.push(text.to_string());
        self.string_ids.insert(text.to_string(), id);
        id
    }

    fn value_type(&mut self, kind: &str, unit: &str) -> ValueType {
        ValueType { r#type: self.string(kind), unit: self.string(unit) }
    }

    fn label(&mut self, key: &str, value: &str) -> Label {
        Label { key: self.string(key), str: self.string(value), num: 0, num_unit: 0 }
    }

    fn number(&mut self, key: &str, value: u64) -> Label {
        Label { key: self.string(key), str: 0, num: value as i64, num_unit: 0 }
    }

    /// One sample per thread where the stack has them, else one for the process.
    fn add_stack(&mut self, stack: &WeightedStack, kind: &Kind, facts: &ProfileFacts) {
        let mut frames: &[Frame] = &stack.frames;
        let mut labels =
            vec![self.number("pid", u64::from(stack.pid)), self.label("process", &stack.process)];
        if let (Some(key), Some(first)) = (kind.label_key(), frames.first())
            && first.module.is_empty()
            && first.function.starts_with('[')
        {
            labels.push(self.label(key, first.function.trim_matches(['[', ']'])));
            frames = &frames[1..];
        }
        // pprof lists the leaf first.
        let location_ids: Vec<u64> = frames.iter().rev().map(|frame| self.location(frame, facts)).collect();
        if stack.threads.is_empty() {
            self.samples.push(Sample { location_ids, values: kind.values(stack.weight), labels });
            return;
        }
        for (tid, thread, weight) in &stack.threads {
            let mut labels = labels.clone();
            labels.push(self.number("tid", u64::from(*tid)));
            labels.push(self.label("thread", thread));
            self.samples.push(Sample {
                location_ids: location_ids.clone(),
                values: kind.values(*weight),
                labels,
            });
        }
    }

    /// The location of a frame: one per function and module, in the module's mapping.
    fn location(&mut self, frame: &Frame, facts: &ProfileFacts) -> u64 {
        let key = (frame.function.clone(), frame.module.clone());
        if let Some(id) = self.location_ids.get(&key) {
            return *id;
        }
        let mapping_id = self.mapping(&frame.module, facts);
        // A Python frame names its file and line ("train_step (train.py:42)"): the function is
        // then the code object, the location its line. Native frames have no line: symbols are
        // read without DWARF's line tables.
        let (function, file, line) = match python_line(frame) {
            Some((function, line)) => (function, &*frame.module, line),
            None => (&*frame.function, "", 0),
        };
        let function_key = (function.to_string(), frame.module.clone());
        let function_id = match self.function_ids.get(&function_key) {
            Some(&id) => id,
            None => {
                let id = self.functions.len() as u64 + 1;
                let (name, filename) = (self.string(function), self.string(file));
                self.functions.push(Function { id, name, system_name: name, filename });
                self.function_ids.insert(function_key, id);
                id
            }
        };
        let id = self.locations.len() as u64 + 1;
        self.locations.push(Location {
            id,
            mapping_id,
            address: 0,
            lines: vec![Line { function_id, line }],
            is_folded: false,
        });
        self.location_ids.insert(key, id);
        id
    }

    /// The mapping of a module, with its file and build id when known; 0 (none) for a frame
    /// that names no module (a label).
    fn mapping(&mut self, module: &str, facts: &ProfileFacts) -> u64 {
        if module.is_empty() {
            return 0;
        }
        if let Some(id) = self.mapping_ids.get(module) {
            return *id;
        }
        let file = facts.modules.get(module);
        let filename = self.string(file.map_or(module, |f| f.path.as_str()));
        let build_id = self.string(file.and_then(|f| f.build_id.as_deref()).unwrap_or(""));
        let id = self.mappings.len() as u64 + 1;
        self.mappings.push(Mapping {
            id,
            memory_start: 0,
            memory_limit: 0,
            file_offset: 0,
            filename,
            build_id,
            has_functions: true,
            has_filenames: false,
            has_line_numbers: false,
            has_inline_frames: true,
        });
        self.mapping_ids.insert(module.to_string(), id);
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, module: &str) -> Frame {
        Frame::new(function.into(), module.into())
    }

    /// The message as a reader decodes the bytes `write` gives.
    fn encode(name: &str, title: &str, profile: &StackProfile, facts: &ProfileFacts) -> Profile {
        let mut bytes = Vec::new();
        write(name, title, profile, facts, &mut bytes).unwrap();
        Profile::decode(bytes.as_slice()).unwrap()
    }

    #[test]
    fn the_reason_frame_becomes_a_label_and_the_leaf_comes_first() {
        let profile = StackProfile {
            unit: "us".into(),
            stacks: vec![WeightedStack {
                pid: 42,
                process: "app".into(),
                frames: vec![frame("[sleep]", ""), frame("main", "app"), frame("nap", "app")],
                weight: 1500,
                threads: vec![],
            }],
        };
        let message = encode("offcpu", "t", &profile, &ProfileFacts::default());
        let text = |i: i64| message.string_table[i as usize].as_str();
        let sample = &message.samples[0];
        assert_eq!(sample.values, [1_500_000]);
        let leaf = &message.locations[sample.location_ids[0] as usize - 1];
        let function = &message.functions[leaf.lines[0].function_id as usize - 1];
        assert_eq!(text(function.name), "nap");
        assert_eq!(sample.location_ids.len(), 2, "the reason is a label, not a frame");
        let labels: Vec<(&str, &str, i64)> =
            sample.labels.iter().map(|l| (text(l.key), text(l.str), l.num)).collect();
        assert!(labels.contains(&("reason", "sleep", 0)), "{labels:?}");
        assert!(labels.contains(&("pid", "", 42)), "{labels:?}");
    }

    #[test]
    fn python_frames_carry_their_file_and_line() {
        let profile = StackProfile {
            unit: "samples".into(),
            stacks: ["train_step (train.py:42)", "train_step (train.py:43)"]
                .iter()
                .map(|leaf| WeightedStack {
                    pid: 7,
                    process: "python3".into(),
                    frames: vec![frame("main (train.py:9)", "train.py"), frame(leaf, "train.py")],
                    weight: 3,
                    threads: vec![],
                })
                .collect(),
        };
        let message = encode("cpu", "t", &profile, &ProfileFacts::default());
        let text = |i: i64| message.string_table[i as usize].as_str();
        let lines: Vec<(&str, &str, i64)> = message
            .samples
            .iter()
            .map(|sample| {
                let line = &message.locations[sample.location_ids[0] as usize - 1].lines[0];
                let function = &message.functions[line.function_id as usize - 1];
                (text(function.name), text(function.filename), line.line)
            })
            .collect();
        assert_eq!(lines, [("train_step", "train.py", 42), ("train_step", "train.py", 43)]);
        // One function, two lines of it; and main.
        assert_eq!(message.functions.len(), 2);
        assert_eq!(python_line(&frame("[unknown] libc.so.6+0x10", "libc.so.6")), None);
    }

    #[test]
    fn cpu_samples_carry_their_cpu_time_and_their_threads() {
        let profile = StackProfile {
            unit: "samples".into(),
            stacks: vec![WeightedStack {
                pid: 7,
                process: "busy".into(),
                frames: vec![frame("main", "busy")],
                weight: 5,
                threads: vec![(7, "busy".into(), 3), (8, "worker".into(), 2)],
            }],
        };
        let facts = ProfileFacts { cpu_period_ns: Some(10_101_010), ..ProfileFacts::default() };
        let message = encode("cpu", "t", &profile, &facts);
        assert_eq!(message.samples.len(), 2);
        assert_eq!(message.samples[0].values, [3, 30_303_030]);
        assert_eq!(message.period, 10_101_010);
        let total: i64 = message.samples.iter().map(|s| s.values[0]).sum();
        assert_eq!(total, 5);
    }
}
