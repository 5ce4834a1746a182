//! The read-out: what the families read from the kernel's maps at the end of a trace, through
//! one reader that either asks the kernel and keeps what it answered, or answers from what was
//! kept. The analysis after it is the same code either way, so a saved read-out (see
//! `record/mod.rs`) replays a real run through analysis, report and Markdown without root.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use anyhow::Context as _;
use aya::{
    Pod,
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray},
};
use serde::{Deserialize, Serialize};

use sysprof_common::{Counter, names};

use crate::probes::Probes;

/// The contents of the maps as they were read: the bytes of each key and value, so the record
/// stays the kernel's view (no family's types are needed to save or load it).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MapSnapshot {
    /// Hash maps: name -> every (key, value).
    #[serde(default)]
    hashes: BTreeMap<String, Vec<(Bytes, Bytes)>>,
    /// Stack maps: name -> stack id -> instruction pointers, innermost first.
    #[serde(default)]
    stacks: BTreeMap<String, BTreeMap<u32, Vec<u64>>>,
    /// Per-CPU arrays: name -> index -> each CPU's value.
    #[serde(default)]
    per_cpu: BTreeMap<String, BTreeMap<u32, Vec<Bytes>>>,
}

impl MapSnapshot {
    /// The values of the hash map `name`, for the read-out's check.
    pub(crate) fn hash_values(&self, name: &str) -> impl Iterator<Item = &Bytes> {
        self.hashes.get(name).into_iter().flatten().map(|(_, value)| value)
    }

    /// Every per-CPU array's entries: (array, index, each CPU's bytes), for the read-out's
    /// check (`Recording::check`).
    pub(crate) fn per_cpu_entries(&self) -> impl Iterator<Item = (&str, u32, &[Bytes])> {
        self.per_cpu.iter().flat_map(|(name, array)| {
            array.iter().map(move |(index, values)| (name.as_str(), *index, values.as_slice()))
        })
    }
}

/// Bytes, written as hex.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Bytes(#[serde(with = "hex::serde")] Vec<u8>);

impl Bytes {
    pub(crate) fn of<T: Pod>(value: &T) -> Self {
        Bytes(bytes_of(value))
    }

    pub(crate) fn decode<T: Pod>(&self) -> anyhow::Result<T> {
        from_bytes(&self.0)
    }

    /// A key of map `name`, which may have been saved before its type grew (see
    /// [`GROWN_KEYS`]): its added fields read as 0.
    fn decode_key<T: Pod>(&self, name: &str) -> anyhow::Result<T> {
        let grown = GROWN_KEYS.iter().any(|&(map, size)| map == name && size == self.0.len());
        if grown && self.0.len() < size_of::<T>() {
            let mut bytes = self.0.clone();
            bytes.resize(size_of::<T>(), 0);
            return from_bytes(&bytes);
        }
        from_bytes(&self.0)
    }
}

/// Maps whose key type grew fields at its end since read-outs were first saved, with its size
/// before. The program image a stack was taken in (`sysprof_common::exec_id`), added to every
/// key that holds a user stack: an older read-out's keys hold none, which reads as unknown,
/// each process's one image.
const GROWN_KEYS: [(&str, usize); 5] = [
    (names::CPU_SAMPLES, 32),
    (names::OFFCPU, 16),
    (names::WAKES, 32),
    (names::FAULT_STACKS, 16),
    (names::ALLOC_STACKS, 16),
];

/// Reads the maps: from the kernel (keeping every answer when asked), or from a saved
/// read-out.
pub(crate) enum MapReader<'a> {
    /// `kernel`: every kernel address the stacks read hold (see `ksyms.rs`).
    Live {
        probes: &'a Probes,
        kept: Option<MapSnapshot>,
        kernel: BTreeSet<u64>,
    },
    Replay(&'a MapSnapshot),
}

impl<'a> MapReader<'a> {
    /// Reads from the kernel; `keep`: also keeps the bytes of every answer, for a read-out
    /// that is saved (a copy of every map otherwise not worth its memory).
    pub(crate) fn live(probes: &'a Probes, keep: bool) -> Self {
        MapReader::Live { probes, kept: keep.then(MapSnapshot::default), kernel: BTreeSet::new() }
    }

    pub(crate) fn replay(contents: &'a MapSnapshot) -> Self {
        MapReader::Replay(contents)
    }

    /// Every kernel address in the stacks read so far (none for a replay, whose names were
    /// saved).
    pub(crate) fn kernel_addresses(&self) -> BTreeSet<u64> {
        match self {
            MapReader::Live { kernel, .. } => kernel.clone(),
            MapReader::Replay(_) => BTreeSet::new(),
        }
    }

    /// What the live reader kept (empty when it kept nothing, and for a replay).
    pub(crate) fn into_contents(self) -> MapSnapshot {
        match self {
            MapReader::Live { kept, .. } => kept.unwrap_or_default(),
            MapReader::Replay(_) => MapSnapshot::default(),
        }
    }

    /// Every entry of a hash map.
    pub(crate) fn entries<K: Pod, V: Pod>(&mut self, name: &str) -> anyhow::Result<Vec<(K, V)>> {
        let mut entries = Vec::new();
        self.for_each_entry(name, |key, value| entries.push((key, value)))?;
        // Held until its family is analyzed, beside the others': without the room its growth
        // left (a quarter of it on average, megabytes for a busy host's off-CPU entries).
        entries.shrink_to_fit();
        Ok(entries)
    }

    /// Hands every entry of a hash map to `each`, one at a time: for maps whose values are
    /// big and many (a machine-wide trace's syscall statistics are thousands of 1.3 KB
    /// histograms), which the caller boils down as they come instead of holding them all.
    pub(crate) fn for_each_entry<K: Pod, V: Pod>(
        &mut self,
        name: &str,
        mut each: impl FnMut(K, V),
    ) -> anyhow::Result<()> {
        match self {
            MapReader::Live { probes, kept, .. } => {
                let map: BpfHashMap<&MapData, K, V> = BpfHashMap::try_from(probes.map(name)?)?;
                pass_and_keep(kept, name, map.iter().map(|entry| Ok(entry?)), each)
            }
            MapReader::Replay(contents) => {
                for (key, value) in contents.hashes.get(name).into_iter().flatten() {
                    let decoded = key.decode_key(name).and_then(|key| Ok((key, value.decode()?)));
                    let (key, value) = decoded.with_context(|| format!("map {name} in the read-out"))?;
                    each(key, value);
                }
                Ok(())
            }
        }
    }

    /// Hands each entry of the array `name` that `wanted` picks to `each`, with its index. The
    /// entries kept are saved as a hash map's are (keyed by index), so a replay reads them the
    /// same way.
    pub(crate) fn for_each_array_entry<V: Pod>(
        &mut self,
        name: &str,
        wanted: impl Fn(&V) -> bool,
        each: impl FnMut(u32, V),
    ) -> anyhow::Result<()> {
        match self {
            MapReader::Live { probes, kept, .. } => {
                let array: Array<&MapData, V> = Array::try_from(probes.map(name)?)?;
                let entries = (0..array.len())
                    .map(|index| Ok((index, array.get(&index, 0)?)))
                    .filter(|entry| entry.as_ref().map_or(true, |(_, value)| wanted(value)));
                pass_and_keep(kept, name, entries, each)
            }
            MapReader::Replay(_) => self.for_each_entry(name, each),
        }
    }

    /// The stacks of `ids` in stack map `name`, each id marked `stack::OVERFLOW` read from the
    /// map's overflow (keyed by the marked id, as the programs gave it), each marked
    /// `stack::UNWOUND` from the unwinder's map.
    pub(crate) fn stacks(
        &mut self,
        name: &str,
        ids: &BTreeSet<u32>,
    ) -> anyhow::Result<HashMap<u32, Vec<u64>>> {
        // User stacks the unwinder walked live in its own map, whichever family took them.
        let unwound_flag = sysprof_common::stack::UNWOUND as u32;
        let (unwound, ids): (BTreeSet<u32>, BTreeSet<u32>) =
            ids.iter().partition(|id| *id & unwound_flag != 0);
        let flag = sysprof_common::stack::OVERFLOW as u32;
        let (spilled, own): (BTreeSet<u32>, BTreeSet<u32>) = ids.iter().partition(|id| *id & flag != 0);
        let mut stacks = self.stacks_of(name, &own)?;
        if !unwound.is_empty() {
            stacks.extend(self.stacks_of(sysprof_common::unwind::STACKS, &unwound)?);
        }
        if let Some(overflow) = sysprof_common::names::overflow_of(name)
            && !spilled.is_empty()
        {
            let unmarked: BTreeSet<u32> = spilled.iter().map(|id| id & !flag).collect();
            stacks.extend(self.stacks_of(overflow, &unmarked)?.into_iter().map(|(id, ips)| (id | flag, ips)));
        }
        Ok(stacks)
    }

    fn stacks_of(&mut self, name: &str, ids: &BTreeSet<u32>) -> anyhow::Result<HashMap<u32, Vec<u64>>> {
        match self {
            MapReader::Live { probes, kept, kernel } => {
                let stacks = probes.stacks_in(name, ids)?;
                kernel.extend(stacks.values().flatten().copied().filter(|&ip| crate::ksyms::is_kernel(ip)));
                if let Some(kept) = kept {
                    kept.stacks.entry(name.to_string()).or_default().extend(stacks.clone());
                }
                Ok(stacks)
            }
            MapReader::Replay(contents) => Ok(contents
                .stacks
                .get(name)
                .map(|stacks| ids.iter().filter_map(|id| Some((*id, stacks.get(id)?.clone()))).collect())
                .unwrap_or_default()),
        }
    }

    /// Each CPU's value at `index` of the per-CPU array `name`.
    pub(crate) fn per_cpu<V: Pod>(&mut self, name: &str, index: u32) -> anyhow::Result<Vec<V>> {
        match self {
            MapReader::Live { probes, kept, .. } => {
                let array: PerCpuArray<&MapData, V> = PerCpuArray::try_from(probes.map(name)?)?;
                let values: Vec<V> = array.get(&index, 0)?.iter().copied().collect();
                if let Some(kept) = kept {
                    kept.per_cpu
                        .entry(name.to_string())
                        .or_default()
                        .insert(index, values.iter().map(Bytes::of).collect());
                }
                Ok(values)
            }
            MapReader::Replay(contents) => contents
                .per_cpu
                .get(name)
                .and_then(|array| array.get(&index))
                .map(|values| values.iter().map(Bytes::decode).collect())
                .unwrap_or_else(|| Ok(Vec::new()))
                .with_context(|| format!("map {name} in the read-out")),
        }
    }
}

fn bytes_of<T: Pod>(value: &T) -> Vec<u8> {
    // SAFETY: `T: Pod` is plain data: every shared type is `#[repr(C)]` with explicit integer
    // fields and no padding (`shared!` pins its size), so all its bytes are initialized.
    unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

fn from_bytes<T: Pod>(bytes: &[u8]) -> anyhow::Result<T> {
    anyhow::ensure!(
        bytes.len() == size_of::<T>(),
        "an entry of {} bytes where {} were expected: the read-out is from another version of sysprof",
        bytes.len(),
        size_of::<T>()
    );
    // SAFETY: the length is checked; `T: Pod` is valid for any bit pattern; read_unaligned as
    // the vector's buffer is only byte-aligned.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// The sum of counts a read-out claims, held at `u64::MAX` rather than wrapped (or, with
/// overflow checks, panicking): a replayed read-out's counts are the file's word, and the
/// kernel's own do not come near it.
pub(crate) fn saturating_sum(values: impl IntoIterator<Item = u64>) -> u64 {
    values.into_iter().fold(0, u64::saturating_add)
}

/// In-kernel counters, summed over CPUs.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters([u64; Counter::SLOTS as usize]);

impl Counters {
    pub fn get(&self, counter: Counter) -> u64 {
        self.0[counter as usize]
    }

    /// The counters, live or replayed.
    pub(crate) fn read(maps: &mut MapReader<'_>) -> anyhow::Result<Self> {
        let mut counters = Counters::default();
        for (slot, total) in counters.0.iter_mut().enumerate() {
            // A replayed read-out's counters are bounded by its check (`Recording::check`); the
            // sum saturates all the same, as no count can wrap to a small one.
            *total =
                maps.per_cpu::<u64>(names::COUNTERS, slot as u32)?.into_iter().fold(0, u64::saturating_add);
        }
        Ok(counters)
    }

    /// The kernel's counters now (the status line's; nothing is kept).
    pub(crate) fn now(probes: &Probes) -> anyhow::Result<Self> {
        Counters::read(&mut MapReader::live(probes, false))
    }
}

/// Hands the live map `name`'s `entries` to `each` as they are read, keeping their bytes in
/// `kept` when the reader keeps what it reads (as a hash map's, so that a replay reads an
/// array's entries back the same way, keyed by index).
fn pass_and_keep<K: Pod, V: Pod>(
    kept: &mut Option<MapSnapshot>,
    name: &str,
    entries: impl Iterator<Item = anyhow::Result<(K, V)>>,
    mut each: impl FnMut(K, V),
) -> anyhow::Result<()> {
    let mut bytes = kept.as_ref().map(|_| Vec::new());
    for entry in entries {
        let (key, value) = entry.with_context(|| format!("reading map {name}"))?;
        if let Some(bytes) = &mut bytes {
            bytes.push((Bytes::of(&key), Bytes::of(&value)));
        }
        each(key, value);
    }
    if let (Some(kept), Some(bytes)) = (kept, bytes) {
        kept.hashes.insert(name.to_string(), bytes);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use sysprof_common::SampleKey;

    use super::*;

    #[test]
    fn a_replayed_entry_is_the_one_that_was_kept() {
        let key = SampleKey {
            tgid: 7,
            tid: 8,
            user_stack_id: -1,
            kernel_stack_id: 3,
            comm: *b"busy\0\0\0\0\0\0\0\0\0\0\0\0",
            exec_id: 5,
        };
        let mut contents = MapSnapshot::default();
        contents.hashes.insert("M".into(), vec![(Bytes::of(&key), Bytes::of(&42u64))]);
        let json = serde_json::to_string(&contents).unwrap();
        let contents: MapSnapshot = serde_json::from_str(&json).unwrap();
        let entries: Vec<(SampleKey, u64)> = MapReader::replay(&contents).entries("M").unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!((entries[0].0.tgid, entries[0].0.kernel_stack_id, entries[0].1), (7, 3, 42));
        assert!(MapReader::replay(&contents).entries::<u64, u64>("M").is_err(), "sizes are checked");
    }

    /// A key saved before its image field was added reads with the field 0 (unknown); in a
    /// map whose key did not grow, a short key is still refused.
    #[test]
    fn a_key_saved_before_it_grew_reads_its_new_fields_as_zero() {
        let key = SampleKey {
            tgid: 7,
            tid: 8,
            user_stack_id: 4,
            kernel_stack_id: 3,
            comm: *b"busy\0\0\0\0\0\0\0\0\0\0\0\0",
            exec_id: 5,
        };
        let mut old = Bytes::of(&key);
        old.0.truncate(32);
        let mut contents = MapSnapshot::default();
        contents.hashes.insert(names::CPU_SAMPLES.into(), vec![(old.clone(), Bytes::of(&42u64))]);
        contents.hashes.insert("M".into(), vec![(old, Bytes::of(&42u64))]);
        let entries: Vec<(SampleKey, u64)> =
            MapReader::replay(&contents).entries(names::CPU_SAMPLES).unwrap();
        assert_eq!(entries, [(SampleKey { exec_id: sysprof_common::exec_id::UNKNOWN, ..key }, 42)]);
        assert!(MapReader::replay(&contents).entries::<SampleKey, u64>("M").is_err());
    }
}
