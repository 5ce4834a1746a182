//! Kernel struct layouts read from BTF.
//!
//! Rust BPF programs cannot emit CO-RE relocations, so the few `task_struct` fields they read
//! get their offsets from the running kernel's BTF here and reach the programs as globals.
//!
//! The offsets are found by walking the raw type section once, without building the whole
//! type graph: a general BTF parser (btf-rs, aya-obj) spends 50-150 ms on a distribution
//! kernel's 6 MB of BTF, most of sysprof's start-up, to answer three questions. The tests check
//! this walk against btf-rs on the running kernel, field by field.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Where the running kernel publishes its BTF. `SYSPROF_BTF` overrides it, which is how the
/// tests play a kernel without BTF.
pub fn vmlinux_btf_path() -> PathBuf {
    std::env::var_os("SYSPROF_BTF").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(KERNEL_BTF))
}

/// Offsets of the `task_struct` fields the process programs read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskOffsets {
    pub pid: u32,
    pub tgid: u32,
    /// `thread.fsbase` (x86_64): 3.10's Python threads are known by it. 0 where the kernel
    /// has no such field.
    pub fsbase: u32,
    /// `min_flt` and `maj_flt`: each thread's own fault counts, which the exit program reads
    /// (0 where the kernel has no such field: the fault programs then count every fault).
    pub min_flt: u32,
    pub maj_flt: u32,
    /// `se.sum_exec_runtime`: each thread's time on a CPU as the scheduler counts it, which
    /// leaves out what the hypervisor took (steal); 0 where the kernel has no such field.
    pub exec_runtime: u32,
    /// `start_boottime`: when a task started, which the fork program sends with each new
    /// process; 0 where the kernel has no such field.
    pub start_boottime: u32,
    /// `signal` and `signal_struct::live`: how many of a task's process's threads have not
    /// begun to exit, which the exit program reads; 0 where unknown.
    pub signal: u32,
    pub signal_live: u32,
    /// `mm` and `mm_struct::context.vdso`: which address space a task runs in, by where its
    /// vDSO is (see `unwind::ProcessMappings::vdso`); 0 where unknown.
    pub mm: u32,
    pub mm_vdso: u32,
    /// `self_exec_id`: which program image a task runs, which every stack's key holds (see
    /// `sysprof_common::exec_id`); 0 where unknown.
    pub exec_id: u32,
}

impl TaskOffsets {
    /// Reads the offsets from the kernel BTF at `path`.
    pub fn from_btf(path: &Path) -> anyhow::Result<Self> {
        Ok(read_kernel_types(path)?.0)
    }

    fn from_index(btf: &TypeIndex<'_>) -> anyhow::Result<Self> {
        Ok(TaskOffsets {
            pid: btf.member_offset("task_struct", "pid")?,
            tgid: btf.member_offset("task_struct", "tgid")?,
            fsbase: btf
                .member_offset("task_struct", "thread")
                .and_then(|thread| Ok(thread + btf.member_offset("thread_struct", "fsbase")?))
                .unwrap_or(0),
            min_flt: btf.member_offset("task_struct", "min_flt").unwrap_or(0),
            maj_flt: btf.member_offset("task_struct", "maj_flt").unwrap_or(0),
            exec_runtime: btf
                .member_offset("task_struct", "se")
                .and_then(|se| Ok(se + btf.member_offset("sched_entity", "sum_exec_runtime")?))
                .unwrap_or(0),
            start_boottime: btf.member_offset("task_struct", "start_boottime").unwrap_or(0),
            signal: btf.member_offset("task_struct", "signal").unwrap_or(0),
            signal_live: btf.member_offset("signal_struct", "live").unwrap_or(0),
            mm: btf.member_offset("task_struct", "mm").unwrap_or(0),
            mm_vdso: btf.member_offset("mm_struct", "context.vdso").unwrap_or(0),
            exec_id: btf.member_offset("task_struct", "self_exec_id").unwrap_or(0),
        })
    }
}

/// The `task_struct` offsets and the BTF tracepoints' type ids, from one walk of the kernel
/// BTF at `path`.
pub fn read_kernel_types(path: &Path) -> anyhow::Result<(TaskOffsets, TracepointIds)> {
    let bytes = KernelBtfBytes::read(path).with_context(|| format!("reading BTF {}", path.display()))?;
    let btf = TypeIndex::new(bytes.as_slice()).with_context(|| format!("parsing BTF {}", path.display()))?;
    Ok((TaskOffsets::from_index(&btf)?, TracepointIds::from_index(&btf)))
}

/// The bytes of a BTF file: mapped where the kernel allows it, else read.
///
/// `/sys/kernel/btf/vmlinux` is a sysfs file, which `read` hands out a page per call: 1,345
/// calls and 15 ms for a 5.5 MB BTF here, on the start's critical path. Since Linux 6.16 it can
/// be mapped (private and read-only), and the walk reads its pages in place.
enum KernelBtfBytes {
    Mapped(memmap2::Mmap),
    Read(Vec<u8>),
}

impl KernelBtfBytes {
    fn read(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::File::open(path)?;
        if path == Path::new(KERNEL_BTF) {
            // SAFETY: a private, read-only mapping of the kernel's own BTF, which nothing
            // changes or truncates while the system runs. Any other file (`SYSPROF_BTF`, a
            // test's) is read: one truncated under the mapping would kill sysprof.
            if let Ok(map) = unsafe { memmap2::MmapOptions::new().map_copy_read_only(&file) } {
                return Ok(KernelBtfBytes::Mapped(map));
            }
            // Before 6.16 the kernel refuses to map it: read it.
        }
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut &file, &mut bytes)?;
        Ok(KernelBtfBytes::Read(bytes))
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            KernelBtfBytes::Mapped(map) => map,
            KernelBtfBytes::Read(bytes) => bytes,
        }
    }
}

/// Each BTF tracepoint's type id in the kernel's BTF (the typedef `btf_trace_<name>`), by name.
///
/// A BTF tracepoint program is loaded with that id, and it is all aya takes from the `Btf` it
/// is given (`BtfTracePoint::load` looks the typedef up by name). aya's own parse of the
/// kernel's BTF, 140,000 types, costs some 40 ms of CPU and 20 MB at every start; so sysprof
/// hands it a `Btf` made of just the typedefs it attaches, each at its kernel id, the ids
/// before them filled with empty pointer records (`btf_for`).
#[derive(Clone, Debug, Default)]
pub struct TracepointIds(std::collections::BTreeMap<String, u32>);

/// BTF kinds of the records `btf_for` writes.
const KIND_PTR: u32 = 2;
const KIND_TYPEDEF: u32 = 8;

impl TracepointIds {
    fn from_index(btf: &TypeIndex<'_>) -> Self {
        let ids = (1..=btf.records.len() as u32).filter_map(|id| {
            let record = btf.record(id).filter(|r| r.kind == KIND_TYPEDEF)?;
            let name = btf.name(record.name_off).strip_prefix(b"btf_trace_")?;
            Some((String::from_utf8_lossy(name).into_owned(), id))
        });
        TracepointIds(ids.collect())
    }

    /// The kernel's type id of tracepoint `name`'s typedef.
    pub fn get(&self, name: &str) -> Option<u32> {
        self.0.get(name).copied()
    }

    /// A BTF blob (little-endian, as `TypeIndex` reads) where each of `tracepoints` has its
    /// typedef at its kernel id, for aya's `BtfTracePoint::load`.
    pub fn btf_for(&self, tracepoints: &[&str]) -> anyhow::Result<aya::Btf> {
        let mut wanted = std::collections::BTreeMap::new();
        let mut strings = vec![0u8];
        for &name in tracepoints {
            let id = self.get(name).with_context(|| format!("no BTF tracepoint {name} in the kernel"))?;
            wanted.insert(id, strings.len() as u32);
            strings.extend_from_slice(format!("btf_trace_{name}").as_bytes());
            strings.push(0);
        }
        let last = wanted.keys().next_back().copied().unwrap_or(0);
        let mut types = Vec::with_capacity(last as usize * 12);
        for id in 1..=last {
            let (name_off, kind) = match wanted.get(&id) {
                Some(&name_off) => (name_off, KIND_TYPEDEF),
                None => (0, KIND_PTR),
            };
            for word in [name_off, kind << 24, 0] {
                types.extend_from_slice(&word.to_le_bytes());
            }
        }
        let mut blob = Vec::with_capacity(24 + types.len() + strings.len());
        blob.extend_from_slice(&MAGIC.to_le_bytes());
        blob.extend_from_slice(&[1, 0]); // version 1, no flags
        for word in [24, 0, types.len() as u32, types.len() as u32, strings.len() as u32] {
            blob.extend_from_slice(&word.to_le_bytes());
        }
        blob.extend_from_slice(&types);
        blob.extend_from_slice(&strings);
        aya::Btf::parse(&blob, aya::Endianness::Little).context("the tracepoints' BTF")
    }
}

const MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
/// Kinds that only qualify or rename another type (typedef, volatile, const, restrict,
/// type tag): an anonymous member's type is followed through them.
const QUALIFIERS: [u32; 5] = [8, 9, 10, 11, 18];

/// A BTF blob with the position of every type record: enough to read structs' members.
struct TypeIndex<'a> {
    types: &'a [u8],
    strings: &'a [u8],
    /// Byte offset in `types` of the record of type id `i + 1` (id 0 is void).
    records: Vec<u32>,
}

impl<'a> TypeIndex<'a> {
    fn new(blob: &'a [u8]) -> anyhow::Result<Self> {
        if blob.len() < 24 || u16::from_le_bytes([blob[0], blob[1]]) != MAGIC {
            bail!("not little-endian BTF (bad magic)");
        }
        let header = |at: usize| u32_at(blob, at) as usize;
        let (header_len, type_off, type_len, str_off, str_len) =
            (header(4), header(8), header(12), header(16), header(20));
        let section = |off: usize, len: usize| {
            blob.get(header_len + off..header_len + off + len).context("a BTF section runs past the end")
        };
        let (types, strings) = (section(type_off, type_len)?, section(str_off, str_len)?);
        let mut records = Vec::with_capacity(type_len / 32);
        let mut at = 0;
        while at + 12 <= types.len() {
            records.push(at as u32);
            let info = u32_at(types, at + 4);
            let vlen = (info & 0xffff) as usize;
            // Each kind's trailing data, after the 12-byte common record.
            let extra = match (info >> 24) & 0x1f {
                1 | 14 | 17 => 4,
                3 => 12,
                4 | 5 | 15 | 19 => 12 * vlen,
                6 | 13 => 8 * vlen,
                2 | 7..=12 | 16 | 18 => 0,
                kind => bail!("unknown BTF kind {kind}"),
            };
            at += 12 + extra;
        }
        Ok(TypeIndex { types, strings, records })
    }

    fn name(&self, name_off: u32) -> &'a [u8] {
        let tail = self.strings.get(name_off as usize..).unwrap_or_default();
        &tail[..tail.iter().position(|&b| b == 0).unwrap_or(tail.len())]
    }

    fn record(&self, id: u32) -> Option<Record> {
        let at = *self.records.get(id.checked_sub(1)? as usize)? as usize;
        let info = u32_at(self.types, at + 4);
        Some(Record {
            kind: (info >> 24) & 0x1f,
            name_off: u32_at(self.types, at),
            target: u32_at(self.types, at + 8),
            vlen: (info & 0xffff) as usize,
            kind_flag: info >> 31 == 1,
            at,
        })
    }

    /// Byte offset of `field` in `struct name`, looking through anonymous structs and unions
    /// (randomized layouts wrap fields in one); `field` may name a member of a member
    /// (`context.vdso`).
    fn member_offset(&self, name: &str, field: &str) -> anyhow::Result<u32> {
        for id in self.structs_named(name) {
            let mut found = Some((0, id));
            for part in field.split('.') {
                found = found.and_then(|(bits, id)| {
                    let (offset, member_type) =
                        self.find_member(self.strip_qualifiers(id), part.as_bytes(), 0)?;
                    Some((bits + offset, member_type))
                });
            }
            if let Some((bits, _)) = found {
                if bits % 8 != 0 {
                    bail!("{name}.{field} is a bitfield");
                }
                return Ok(bits / 8);
            }
        }
        bail!("struct {name} has no field {field} in kernel BTF")
    }

    /// The ids of the structs called `name` (a kernel may have several).
    fn structs_named<'s>(&'s self, name: &'s str) -> impl Iterator<Item = u32> + 's {
        (1..=self.records.len() as u32).filter(move |&id| {
            self.record(id).is_some_and(|r| r.kind == KIND_STRUCT && self.name(r.name_off) == name.as_bytes())
        })
    }

    /// Bit offset of `field` in the struct or union `id`, and the field's type.
    fn find_member(&self, id: u32, field: &[u8], depth: u32) -> Option<(u32, u32)> {
        let record = self.record(id)?;
        if !(record.kind == KIND_STRUCT || record.kind == KIND_UNION) || depth > 8 {
            return None;
        }
        for member in 0..record.vlen {
            let base = record.at + 12 + 12 * member;
            let (name_off, member_type, offset) =
                (u32_at(self.types, base), u32_at(self.types, base + 4), u32_at(self.types, base + 8));
            // With kind_flag set, the top 8 bits are a bitfield's size.
            let bits = if record.kind_flag { offset & 0xff_ffff } else { offset };
            let member_name = self.name(name_off);
            if member_name == field {
                return Some((bits, member_type));
            }
            if member_name.is_empty()
                && let Some((nested, nested_type)) =
                    self.find_member(self.strip_qualifiers(member_type), field, depth + 1)
            {
                return Some((bits + nested, nested_type));
            }
        }
        None
    }

    fn strip_qualifiers(&self, mut id: u32) -> u32 {
        for _ in 0..16 {
            match self.record(id) {
                Some(record) if QUALIFIERS.contains(&record.kind) => id = record.target,
                _ => break,
            }
        }
        id
    }
}

/// One type record's common part.
struct Record {
    kind: u32,
    name_off: u32,
    /// The type a qualifier or typedef refers to (a struct's size, unused here).
    target: u32,
    /// Members, for a struct or union.
    vlen: usize,
    /// Members' offsets carry a bitfield size in their top 8 bits.
    kind_flag: bool,
    /// Where the record starts in the type section.
    at: usize,
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    bytes.get(at..at + 4).map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The running kernel's BTF, which CI machines have; elsewhere the test says it skipped.
    fn running_kernel_btf() -> Option<PathBuf> {
        let path = vmlinux_btf_path();
        if !path.exists() && std::env::var_os("CI").is_none() {
            eprintln!("skipped: no kernel BTF at {}", path.display());
            return None;
        }
        Some(path)
    }

    /// What aya finds in the small `Btf` is what it would find in its parse of the whole
    /// kernel BTF: the same id for each tracepoint sysprof attaches.
    #[test]
    fn the_tracepoints_btf_gives_aya_the_kernels_ids() {
        let Some(path) = running_kernel_btf() else { return };
        let (_, ids) = read_kernel_types(&path).unwrap();
        let tracepoints = ["sched_switch", "sched_waking", "sys_enter", "sys_exit", "signal_deliver"];
        let small = ids.btf_for(&tracepoints).unwrap();
        let whole = aya::Btf::parse_file(&path, aya::Endianness::Little).unwrap();
        for name in tracepoints {
            let typedef = format!("btf_trace_{name}");
            let kind = aya_obj::btf::BtfKind::Typedef;
            assert_eq!(
                small.id_by_type_name_kind(&typedef, kind).unwrap(),
                whole.id_by_type_name_kind(&typedef, kind).unwrap(),
                "{name}"
            );
        }
        assert!(ids.btf_for(&["no_such_tracepoint"]).is_err());
    }

    #[test]
    fn task_struct_offsets_from_the_running_kernel() {
        let Some(path) = running_kernel_btf() else { return };
        let offsets = TaskOffsets::from_btf(&path).unwrap();
        // pid and tgid are adjacent pid_t fields in every kernel since 2.6.
        assert_eq!(offsets.tgid, offsets.pid + 4);
        assert!(offsets.pid > 0);
        // min_flt and maj_flt are adjacent unsigned longs (with nvcsw and nivcsw before them).
        assert_eq!(offsets.maj_flt, offsets.min_flt + 8);
        assert!(offsets.min_flt > 0);
        // A u64 inside the task's sched_entity (its offset is checked against btf-rs below).
        assert!(offsets.exec_runtime > 0 && offsets.exec_runtime.is_multiple_of(8));
        // A u64 (since 5.5), after the monotonic start_time beside it.
        assert!(offsets.start_boottime > 0 && offsets.start_boottime.is_multiple_of(8));
        // Pointers: the task's `mm`, and its vDSO's address two structs down in the mm.
        assert!(offsets.mm > 0 && offsets.mm.is_multiple_of(8));
        assert!(offsets.mm_vdso > 0 && offsets.mm_vdso.is_multiple_of(8));
        // A u64 since 5.7 (a u32 before), after `parent_exec_id`.
        assert!(offsets.exec_id > 0 && offsets.exec_id.is_multiple_of(4));
    }

    /// A member of a member (`mm_struct::context.vdso`, through the typedef `mm_context_t`)
    /// is where btf-rs finds it.
    #[test]
    fn a_nested_member_is_where_btf_rs_finds_it() {
        let Some(path) = running_kernel_btf() else { return };
        let bytes = std::fs::read(&path).unwrap();
        let theirs = btf_rs::Btf::from_bytes(&bytes).unwrap();
        let layout = |name: &str| {
            let types = theirs.resolve_types_by_name(name).unwrap();
            let found = types.into_iter().find_map(|t| match t {
                btf_rs::Type::Struct(s) => Some(s),
                btf_rs::Type::Typedef(typedef) => match theirs.resolve_chained_type(&typedef) {
                    Ok(btf_rs::Type::Struct(s)) => Some(s),
                    _ => None,
                },
                _ => None,
            });
            found.unwrap_or_else(|| panic!("no struct {name}"))
        };
        let bits_of = |name: &str, field: &str| {
            let mut fields = Vec::new();
            named_fields(&theirs, &layout(name), 0, &mut fields);
            fields.into_iter().find(|(f, _)| f == field).unwrap_or_else(|| panic!("no {name}.{field}")).1
        };
        let expected = (bits_of("mm_struct", "context") + bits_of("mm_context_t", "vdso")) / 8;
        let offsets = TaskOffsets::from_btf(&path).unwrap();
        assert_eq!(offsets.mm_vdso, expected);
        assert_eq!(offsets.mm * 8, bits_of("task_struct", "mm"));
    }

    /// The walk agrees with btf-rs, a general BTF parser, on every named field of structs
    /// the programs and their neighbours use, nested anonymous members included.
    #[test]
    fn member_offsets_agree_with_btf_rs() {
        let Some(path) = running_kernel_btf() else { return };
        let bytes = std::fs::read(&path).unwrap();
        let ours = TypeIndex::new(&bytes).unwrap();
        let theirs = btf_rs::Btf::from_bytes(&bytes).unwrap();
        let mut compared = 0;
        for name in
            ["task_struct", "thread_struct", "sched_entity", "mm_struct", "sk_buff", "page", "pt_regs"]
        {
            let Ok(types) = theirs.resolve_types_by_name(name) else { continue };
            let Some(btf_rs::Type::Struct(layout)) =
                types.into_iter().find(|t| matches!(t, btf_rs::Type::Struct(_)))
            else {
                continue;
            };
            let mut fields = Vec::new();
            named_fields(&theirs, &layout, 0, &mut fields);
            for (field, bits) in fields {
                let found = ours.find_member_in_struct(name, &field);
                assert_eq!(found, Some(bits), "{name}.{field}");
                compared += 1;
            }
        }
        assert!(compared > 200, "only {compared} fields compared");
    }

    fn named_fields(btf: &btf_rs::Btf, layout: &btf_rs::Struct, base: u32, out: &mut Vec<(String, u32)>) {
        for member in &layout.members {
            let name = btf.resolve_name(member).unwrap_or_default();
            if !name.is_empty() {
                // The first of two same-named fields (none in practice) is the one found.
                if !out.iter().any(|(seen, _)| *seen == name) {
                    out.push((name, base + member.bit_offset()));
                }
            } else if let Ok(btf_rs::Type::Struct(inner) | btf_rs::Type::Union(inner)) =
                btf.resolve_chained_type(member)
            {
                named_fields(btf, &inner, base + member.bit_offset(), out);
            }
        }
    }

    impl TypeIndex<'_> {
        fn find_member_in_struct(&self, name: &str, field: &str) -> Option<u32> {
            self.structs_named(name).find_map(|id| Some(self.find_member(id, field.as_bytes(), 0)?.0))
        }
    }

    #[test]
    fn a_blob_that_is_not_btf_is_refused() {
        assert!(TypeIndex::new(b"not btf at all, not btf at all").is_err());
        assert!(
            TypeIndex::new(&[
                0x9f, 0xeb, 1, 0, 24, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
            ])
            .is_err()
        );
    }
}
