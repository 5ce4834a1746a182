//! The doors of the fuzz targets (`fuzz/fuzz_targets/`): one function per parser of what
//! another user controls, taking the bytes a fuzzer makes and handing them to the parser as
//! sysprof does, so that the parsers themselves stay private to the crate. Each door also
//! uses what the parser returned the way sysprof goes on to (lookups, relocations, a cache
//! entry written and read back), and asserts what must hold of it.
//!
//! `tests/fuzz.rs` feeds every door the committed corpus (`fuzz/corpus/TARGET/`) and every
//! crash the fuzzer found (`fuzz/regressions/TARGET/`), so a plain `cargo test` replays them.

use std::path::{Path, PathBuf};

use crate::{
    merge::{self, RunFiles},
    plt::PltNames,
    procmaps::ProcessMaps,
    python::{
        Interpreter, ProcessCode,
        code::{CodeObjects, Image, ReadMemory as _},
        layout,
    },
    symbolize::PerfMap,
    unwind::{cache, tables},
    uprobes,
};

/// A target's door: takes what the fuzzer made, panics on what it finds.
pub type Door = fn(&[u8]);

/// Every target: its name (its folder under `fuzz/corpus` and `fuzz/regressions`, its file
/// under `fuzz/fuzz_targets`) and its door.
pub const TARGETS: &[(&str, Door)] = &[
    ("eh_frame", eh_frame),
    ("unwind_cache", unwind_cache),
    ("plt", plt),
    ("perf_map", perf_map),
    ("python_layout", python_layout),
    ("python_code", python_code),
    ("uprobe_exports", uprobe_exports),
    ("proc_maps", proc_maps),
    ("readout", readout),
    ("report_json", report_json),
    ("timeline_pftrace", timeline_pftrace),
];

/// An ELF file's unwind table (`.eh_frame` or `.debug_frame`), as the unwinder's worker
/// builds it from a mapped file, then written to the cache and read back as a later run does.
pub fn eh_frame(data: &[u8]) {
    let Ok(inputs) = tables::Inputs::read(data) else { return };
    let key = inputs.key();
    let Ok(table) = tables::build_from(&inputs) else { return };
    assert!(table.rows.windows(2).all(|pair| pair[0].pc < pair[1].pc), "rows sorted and distinct");
    // Whatever the builder makes, the cache reads back whole: else a table built once is
    // rebuilt on every run.
    let entry = cache::encode(&key, &table);
    assert_eq!(cache::decode(&entry[..], entry.len() as u64, &key).as_ref(), Some(&table));
    for &(offset, _) in &table.segments {
        let _ = table.bias(0x7f00_0000_0000, offset & !0xfff);
    }
}

/// A cached unwind table's entry, under the name it carries (a decoded entry must be the one
/// `encode` writes), and again with its CRC-32 made right, so that the checks behind the
/// checksum are reached too.
pub fn unwind_cache(data: &[u8]) {
    let key: cache::Key = data.get(16..48).and_then(|name| name.try_into().ok()).unwrap_or_default();
    let read_back = |entry: &[u8]| {
        if let Some(table) = cache::decode(entry, entry.len() as u64, &key) {
            assert_eq!(cache::encode(&key, &table), entry, "an entry read is the one written");
        }
    };
    read_back(data);
    if let Some(body) = data.len().checked_sub(4) {
        let mut fixed = data.to_vec();
        let checksum = crc32fast::hash(&fixed[..body]);
        fixed[body..].copy_from_slice(&checksum.to_le_bytes());
        read_back(&fixed);
    }
}

/// The PLT stubs' names of an ELF file, asked at every 8th offset of the file and past it.
pub fn plt(data: &[u8]) {
    let names = PltNames::parse(data);
    for offset in (0..data.len() as u64 + 64).step_by(8).chain([u64::MAX]) {
        let _ = names.name(offset);
    }
}

/// A JIT's `/tmp/perf-PID.map` (text: a file that is not UTF-8 is not read), asked at and
/// around every address it names.
pub fn perf_map(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let map = PerfMap::parse(text);
    let starts = text
        .lines()
        .filter_map(|line| u64::from_str_radix(line.split(' ').next()?.trim_start_matches("0x"), 16).ok());
    for start in starts.chain([0, u64::MAX]) {
        for address in [start, start.wrapping_sub(1), start.wrapping_add(1)] {
            let _ = map.find(address);
        }
    }
}

/// Which CPython an ELF file is (by its symbols, `Py_Version`, `_Py_DebugOffsets`; by its
/// name where it has no `Py_Version`), then its walker's entry for a process that maps it
/// at a few addresses from each page of the file.
pub fn python_layout(data: &[u8]) {
    for name in ["libpython3.10.so.1.0", "python3.12"] {
        let Ok(Some(interpreter)) = Interpreter::parse(data, Path::new(name)) else { continue };
        for start in [0x5555_5555_4000, 0x7fff_f7a0_0000, 0xffff_ffff_ffff_f000] {
            for file_offset in (0..data.len() as u64).step_by(4096) {
                let _ = interpreter.process_entry(start, file_offset);
            }
        }
    }
}

/// Where the code object is in the image `python_code` reads.
const IMAGE_BASE: u64 = 0x7f00_0000_0000;
/// What `PyCode_Type`'s address is there (outside the image, as in a process).
const CODE_TYPE: u64 = 0x7f00_dead_0000;

/// A code object read out of a process's memory: the first byte picks the layout (3.10, 3.11,
/// 3.12, or from 3.13's `_Py_DebugOffsets` whose code fields are the next 48 bytes, as a file
/// may claim them); the rest is the memory from the code object on (`IMAGE_BASE`). Its name,
/// file and line table are read as a stack's frames are, and its lines looked up.
pub fn python_code(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else { return };
    let (version, code, image) = match pick % 4 {
        0 => ((3, 10), layout::code_3_10(), rest),
        1 => ((3, 11), layout::code_3_11(), rest),
        2 => ((3, 12), layout::code_3_12(), rest),
        _ => {
            let Some((fields, image)) = rest.split_at_checked(48) else { return };
            let mut offsets = vec![0u8; layout::DEBUG_OFFSETS_SIZE as usize];
            offsets[..8].copy_from_slice(layout::COOKIE);
            offsets[8..16].copy_from_slice(&0x030d_00f0u64.to_le_bytes());
            for (at, field) in [280, 288, 296, 304, 312, 560].into_iter().zip(fields.chunks(8)) {
                offsets[at..at + 8].copy_from_slice(field);
            }
            let Ok((_, code)) = layout::debug_offsets(&offsets) else { return };
            ((3, 13), code, image)
        }
    };
    let memory = Image { base: IMAGE_BASE, bytes: image };
    let objects = CodeObjects { code_type: CODE_TYPE, layout: code, version };
    let _ = memory.signature(IMAGE_BASE, &objects);
    let mut process = ProcessCode { version, ..ProcessCode::default() };
    process.read_stack(1, [IMAGE_BASE, IMAGE_BASE + 8, IMAGE_BASE].into_iter(), &memory, &objects);
    if let Some(code) = process.lookup(1, IMAGE_BASE) {
        for offset in 0..code.lines.len() as u32 + 2 {
            let _ = code.line_at(offset);
        }
    }
}

/// An ELF file's functions, as `--func FILE:SYMBOL` and the GPU libraries' probes read them,
/// then each one's entry probe placed (its first instructions decoded), as at attach: the
/// first 64 functions, as sysprof probes a list of functions, not every one a file has.
pub fn uprobe_exports(data: &[u8]) {
    let Ok(elf) = object::File::parse(data) else { return };
    let exports = uprobes::elf::exports_in(&elf);
    for (name, offset) in exports.iter().take(64) {
        assert_eq!(exports.get(name), Some(&offset));
        let read = |len: u64| {
            let rest = usize::try_from(offset).ok().and_then(|offset| data.get(offset..)).unwrap_or_default();
            rest[..rest.len().min(len as usize)].to_vec()
        };
        #[cfg(target_arch = "x86_64")]
        for past_test in [false, true] {
            let _ = uprobes::entry_point_in(read, offset, exports.size_at(offset), past_test);
        }
    }
}

/// A process's `/proc/PID/maps` (text, its file names the user's), for kernels without
/// `PROCMAP_QUERY`; then each mapping looked up as a sample's address is.
pub fn proc_maps(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    // No such process: what is read of /proc is what a process gone by then gives.
    let maps = ProcessMaps::parse_text(u32::MAX, text);
    for mapping in maps.mappings() {
        for address in [mapping.start, mapping.end.wrapping_sub(1)] {
            if let Some(found) = maps.find(address) {
                let _ = found.file_offset_of(address);
            }
        }
        let _ = mapping.module_name();
    }
}

/// A saved `readout.json`, as `sysprof report DIR` renders it: replayed through the analysis,
/// its profiles rendered (folded, pprof, flamegraphs), then report.md and report.json.
pub fn readout(data: &[u8]) {
    let Ok((report, _files)) = crate::analysis::replay(data) else { return };
    let _ = crate::output::render_report(&report);
    let _ = crate::output::json::size(&report);
}

/// A run's `report.json`, as `sysprof merge` reads it: two ranks that wrote it.
pub fn report_json(data: &[u8]) {
    let run = |dir: &str| RunFiles { dir: PathBuf::from(dir), report: data.to_vec(), timeline: None };
    let _ = merge::merge(vec![run("a"), run("b")]);
}

/// A run's `timeline.pftrace`, as `sysprof merge` reads it: two ranks that wrote it, beside
/// a report each.
pub fn timeline_pftrace(data: &[u8]) {
    let run = |dir: &str, rank: u32| {
        RunFiles {
        dir: PathBuf::from(dir),
        report: format!(
            r#"{{"sysprof_version": "0.1.0", "run": {{"started_at": "2026-01-01T00:00:00Z", "duration_s": 1.0, "samples": 10, "host": "h", "rank": "{rank}"}}}}"#
        )
        .into_bytes(),
        timeline: Some(data.to_vec()),
    }
    };
    let _ = merge::merge(vec![run("a", 0), run("b", 1)]);
}

/// The seeds reach what each door is for: a corpus whose files a parser refuses at its first
/// check would leave the fuzzer mutating from nothing.
#[cfg(test)]
mod tests {
    use super::*;

    fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target);
        let mut seeds: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| {
                let entry = entry.unwrap();
                (entry.file_name().to_string_lossy().into_owned(), std::fs::read(entry.path()).unwrap())
            })
            .collect();
        seeds.sort();
        assert!(!seeds.is_empty(), "no seeds for {target}");
        seeds
    }

    #[test]
    fn every_elf_seed_has_an_unwind_table() {
        for (name, data) in seeds("eh_frame") {
            let table = tables::build(&data).unwrap_or_else(|e| panic!("{name}: {e:#}"));
            assert!(table.rows.len() > 4, "{name}: {} rows", table.rows.len());
        }
    }

    #[test]
    fn every_cache_seed_is_an_entry_sysprof_reads() {
        for (name, data) in seeds("unwind_cache") {
            let key: cache::Key = data[16..48].try_into().unwrap();
            let table = cache::decode(&data[..], data.len() as u64, &key);
            assert!(table.is_some_and(|table| !table.rows.is_empty()), "{name}");
        }
    }

    #[test]
    fn every_plt_seed_names_its_stubs() {
        for (name, data) in seeds("plt") {
            let names = PltNames::parse(&data);
            let named = (0..data.len() as u64).filter_map(|offset| names.name(offset)).collect::<Vec<_>>();
            assert!(named.iter().any(|n| n.ends_with("@plt")), "{name}: {named:?}");
        }
    }

    #[test]
    fn the_python_seeds_are_interpreters_and_their_code_objects_read() {
        let versions: Vec<(String, Option<(u8, u8)>)> = seeds("python_layout")
            .into_iter()
            .map(|(name, data)| {
                let found =
                    Interpreter::parse(&data, Path::new(&name)).unwrap_or_else(|e| panic!("{name}: {e:#}"));
                (name, found.map(|interpreter| interpreter.version))
            })
            .collect();
        assert_eq!(
            versions,
            [
                ("lib.so".to_string(), None),
                ("libpython3.10.so".to_string(), Some((3, 10))),
                ("libpython3.12.so".to_string(), Some((3, 12))),
                ("libpython3.13.so".to_string(), Some((3, 13))),
            ]
        );
        for (name, data) in seeds("python_code") {
            let (version, layout, image) = match data[0] {
                0 => ((3, 10), layout::code_3_10(), &data[1..]),
                1 => ((3, 11), layout::code_3_11(), &data[1..]),
                2 => ((3, 12), layout::code_3_12(), &data[1..]),
                _ => ((3, 13), layout::code_3_12(), &data[49..]),
            };
            let memory = Image { base: IMAGE_BASE, bytes: image };
            let objects = CodeObjects { code_type: CODE_TYPE, layout, version };
            let code = memory.code(IMAGE_BASE, &objects).unwrap_or_else(|| panic!("{name}: no code object"));
            assert!(!code.name.is_empty() && code.file.starts_with("/"), "{name}: {code:?}");
            assert!(code.lines.len() >= 3, "{name}: {code:?}");
        }
    }

    #[test]
    fn the_exports_seeds_have_functions() {
        for (name, data) in seeds("uprobe_exports") {
            let exports = uprobes::elf::exports_in(&object::File::parse(&*data).unwrap());
            assert!(exports.contains_key("main") || exports.contains_key("seed_copy"), "{name}");
        }
    }

    #[test]
    fn the_text_seeds_parse() {
        for (name, data) in seeds("perf_map") {
            let map = PerfMap::parse(std::str::from_utf8(&data).unwrap());
            assert!(map.find(0x7f5e_7c1a_000c).is_some() || map.find(0x7f00_0000_1010).is_some(), "{name}");
        }
        for (name, data) in seeds("proc_maps") {
            let maps = ProcessMaps::parse_text(u32::MAX, std::str::from_utf8(&data).unwrap());
            assert!(maps.mappings().len() >= 2, "{name}: {maps:?}");
        }
    }

    #[test]
    fn the_run_seeds_replay_and_merge() {
        for (name, data) in seeds("readout") {
            crate::analysis::replay(&data).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        }
        let reports = seeds("report_json");
        let timelines = seeds("timeline_pftrace");
        let runs = reports
            .into_iter()
            .zip(timelines)
            .map(|((dir, report), (_, timeline))| RunFiles {
                dir: dir.into(),
                report,
                timeline: Some(timeline),
            })
            .collect();
        let (merged, files) = merge::merge(runs).unwrap();
        assert_eq!(files.len(), 3, "merged.md, merged.json, timeline.pftrace");
        assert!(merged.ranks.iter().filter(|rank| rank.collectives > 0).count() >= 2, "{merged:?}");
    }
}
