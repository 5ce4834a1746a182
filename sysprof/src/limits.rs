//! The limits a trace can run into before it starts, each said in one line with its fix: the
//! memory cgroup that the maps' kernel memory is charged to, and the address-space limit
//! (`ulimit -v`) that the BPF rings and arrays sysprof maps count against.

use std::path::{Path, PathBuf};

use crate::{
    config::Families,
    error::Error,
    kernel_memory::{self, MapSizes, mib},
};

/// The memory cgroup sysprof runs in, where it has a limit: the maps' kernel memory is charged
/// to it, and a map the limit has no room for is not created (ENOMEM).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryCgroup {
    /// Its directory (the one of sysprof's cgroup or of its ancestors with the least room).
    pub dir: PathBuf,
    pub limit: u64,
    pub usage: u64,
}

impl MemoryCgroup {
    /// What the limit leaves.
    pub fn room(&self) -> u64 {
        self.limit.saturating_sub(self.usage)
    }
}

/// A limit at or above this is none (cgroup v1 writes "no limit" as the largest page-aligned
/// i64).
const NO_LIMIT: u64 = 1 << 62;

/// The limited memory cgroup, of sysprof's own or its ancestors', with the least room; `None`
/// where no memory cgroup limits it.
pub fn memory_cgroup() -> Option<MemoryCgroup> {
    let membership = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mut candidates = Vec::new();
    for line in membership.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(hierarchy), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let relative = path.trim_start_matches('/');
        if hierarchy == "0" && controllers.is_empty() {
            if let Ok(root) = crate::target::cgroup2_root() {
                candidates.extend(ancestors(&root, relative, "memory.max", "memory.current"));
            }
        } else if controllers.split(',').any(|c| c == "memory")
            && let Some(root) = cgroup1_memory_root()
        {
            candidates.extend(ancestors(&root, relative, "memory.limit_in_bytes", "memory.usage_in_bytes"));
        }
    }
    candidates.into_iter().min_by_key(MemoryCgroup::room)
}

/// `relative` under `root` and each directory above it that has a limit.
fn ancestors(root: &Path, relative: &str, limit_file: &str, usage_file: &str) -> Vec<MemoryCgroup> {
    let mut found = Vec::new();
    let mut dir = root.join(relative);
    loop {
        let read = |file: &str| std::fs::read_to_string(dir.join(file)).ok()?.trim().parse::<u64>().ok();
        // "max" (v2) does not parse: no limit.
        if let (Some(limit), Some(usage)) = (read(limit_file), read(usage_file))
            && limit < NO_LIMIT
        {
            found.push(MemoryCgroup { dir: dir.clone(), limit, usage });
        }
        if dir == root || !dir.pop() || !dir.starts_with(root) {
            return found;
        }
    }
}

/// Where the cgroup v1 memory controller is mounted, if it is.
fn cgroup1_memory_root() -> Option<PathBuf> {
    let mounts = procfs::process::Process::myself().and_then(|me| me.mountinfo()).ok()?;
    mounts
        .into_iter()
        .find(|m| m.fs_type == "cgroup" && m.super_options.contains_key("memory"))
        .map(|m| m.mount_point)
}

/// Refuses a load whose maps, by [`kernel_memory::estimate`], cannot fit in the room sysprof's
/// memory cgroup leaves: tried, it would fail at the map that finds none, or push the cgroup
/// to its limit and have the kernel kill sysprof (`sysprof check` was, in a 64 MB cgroup).
/// Costs nothing where no memory cgroup limits sysprof.
pub(crate) fn check_kernel_memory(sizes: &MapSizes, cgroup: Option<&MemoryCgroup>) -> Result<(), Error> {
    let Some(cgroup) = cgroup else { return Ok(()) };
    let needed = kernel_memory::estimate(sizes);
    if needed <= cgroup.room() {
        return Ok(());
    }
    Err(Error::KernelMemory {
        what: "sysprof's BPF maps do not fit in its memory cgroup".into(),
        reason: out_of_kernel_memory(sizes, Some(cgroup)),
    })
}

/// The error of a failed load, in one line: a map the kernel had no memory for says how much
/// the trace needs against the memory cgroup's room (`cgroup`: as it was before the load), and
/// the options that fit in it.
pub(crate) fn load_error(
    error: aya::EbpfError,
    sizes: &MapSizes,
    cgroup: Option<&MemoryCgroup>,
) -> anyhow::Error {
    // aya's message repeats itself ("failed to create map `X`: failed to create map `X`: ..."):
    // its parts are taken apart here.
    if let aya::EbpfError::MapError(aya::maps::MapError::CreateError { name, io_error }) = &error {
        let reason = match io_error.raw_os_error() {
            Some(libc::ENOMEM) => out_of_kernel_memory(sizes, cgroup),
            _ => io_error.to_string(),
        };
        return Error::KernelMemory { what: format!("cannot create BPF map {name}"), reason }.into();
    }
    anyhow::Error::new(error).context("loading sysprof's BPF object")
}

/// Why the maps find no memory, and the fix: the trace's need against the cgroup's room, and
/// smaller options that fit.
pub(crate) fn out_of_kernel_memory(sizes: &MapSizes, cgroup: Option<&MemoryCgroup>) -> String {
    let needed = kernel_memory::estimate(sizes);
    let Some(cgroup) = cgroup else {
        return format!(
            "the kernel had no memory for it (this trace's maps take about {} MiB): {}",
            mib(needed),
            smaller_options(sizes, None)
        );
    };
    format!(
        "this trace's maps take about {} MiB of kernel memory, and sysprof's memory cgroup {} allows {} MiB, {} \
         MiB of it in use: raise its limit, or {}",
        mib(needed),
        cgroup.dir.display(),
        cgroup.limit >> 20,
        mib(cgroup.usage),
        smaller_options(sizes, Some(cgroup.room()))
    )
}

/// What sysprof itself takes of a memory cgroup while it traces, beside its maps: its heap
/// grows by some 10 to 40 MB over a trace (the tables, the read-out, the report), the most in a
/// system-wide trace of a busy machine, whose every process it symbolizes.
const OWN_MEMORY: u64 = 32 << 20;

/// Whether maps of `bytes` leave sysprof enough of `room` to trace: its own memory is charged
/// to the same cgroup ([`OWN_MEMORY`], and a quarter of the maps to spare for the estimate).
pub(crate) fn leaves_room(bytes: u64, room: u64) -> bool {
    bytes + bytes / 4 + OWN_MEMORY <= room
}

/// Options that make the maps smaller, the first that fits in `room` with [`OWN_MEMORY`] and a
/// quarter to spare (sysprof's own memory is charged to the same cgroup), with what it takes:
/// smaller stack maps and unwind tables first, then the on-CPU samples alone.
fn smaller_options(sizes: &MapSizes, room: Option<u64>) -> String {
    let row_chunk = size_of::<sysprof_common::unwind::RowChunk>() as u64;
    let unwind_now = ((u64::from(sizes.unwind_chunks) * row_chunk) >> 20) as u32;
    let cpu_only =
        Families { cpu: true, sched: false, syscalls: false, gpu: false, memory: false, heap: false };
    let mut candidates: Vec<(String, u64)> = Vec::new();
    for (focus, families) in [("", sizes.families), (" --focus cpu", cpu_only)] {
        for (stacks, unwind) in [(sizes.stacks / 4, unwind_now), (sizes.stacks / 16, 4), (1024, 0)] {
            let (stacks, unwind) =
                (stacks.clamp(1024.min(sizes.stacks), sizes.stacks), unwind.min(unwind_now));
            let smaller = MapSizes {
                stacks,
                unwind_chunks: kernel_memory::unwind_chunks(unwind),
                families,
                calls: sizes.calls && focus.is_empty(),
                ..*sizes
            };
            let options = format!("{focus} --stack-storage-size {stacks} --unwind-memory {unwind}");
            if !candidates.iter().any(|(known, _)| *known == options) {
                candidates.push((options, kernel_memory::estimate(&smaller)));
            }
        }
    }
    let fits = |bytes: u64| room.is_none_or(|room| leaves_room(bytes, room));
    match candidates.iter().find(|(_, bytes)| fits(*bytes)) {
        Some((options, bytes)) => format!("trace with{options} (about {} MiB)", mib(*bytes)),
        None => {
            let (options, bytes) = candidates.last().cloned().unwrap_or_default();
            format!("lower what else the cgroup holds: even{options} takes about {} MiB", mib(bytes))
        }
    }
}

/// The address-space limit (`ulimit -v`, RLIMIT_AS) sysprof runs under, in bytes; `None`
/// when there is none.
pub fn address_space_limit() -> Option<u64> {
    let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_AS).ok()?;
    (soft != nix::sys::resource::RLIM_INFINITY).then_some(soft)
}

/// Address space a trace takes beyond what sysprof has mapped when it starts: its threads'
/// stacks, the BPF rings it maps (the call events' 4 MiB twice over, the timeline's, the
/// processes'), the target set's array, and the files it reads to symbolize and to build unwind
/// tables (each mapped whole while read). Measured (release build, peak VmSize less VmSize at
/// the start of 12 to 15 MiB): `-- true` 43 MiB, `--malloc -- sleep 1` 51 MiB; `--all` went to
/// 450 MiB here, mapping the files of every process, yet ran under a limit of 88 MiB. Under
/// 30 MiB of limit the first thread or ring refused panicked (with `RUST_BACKTRACE`, a
/// backtrace), or left the runtime waiting for a thread that was never started.
pub const ADDRESS_SPACE_NEEDED: u64 = 64 << 20;

/// Refuses to start under an address-space limit that leaves less than a trace needs: past it
/// the first thread or ring that cannot be mapped would stop the trace halfway (a panic, a
/// hang, a ring that fails to map after the probes were attached).
pub fn check_address_space() -> Result<(), Error> {
    let Some(limit) = address_space_limit() else { return Ok(()) };
    let in_use = vm_size().unwrap_or(0);
    if limit >= in_use + ADDRESS_SPACE_NEEDED {
        return Ok(());
    }
    Err(Error::AddressSpace {
        what: format!(
            "a trace needs about {} MiB of address space beyond the {} MiB sysprof starts with",
            ADDRESS_SPACE_NEEDED >> 20,
            mib(in_use)
        ),
        limit_kib: limit / 1024,
    })
}

/// A failure to map `what` into sysprof's memory, said as the address-space limit's when there
/// is one and the kernel answered ENOMEM.
pub(crate) fn mapping_failed(what: String, error: &std::io::Error) -> Option<Error> {
    let limit = address_space_limit()?;
    (error.raw_os_error() == Some(libc::ENOMEM))
        .then(|| Error::AddressSpace { what: format!("{what} could not be mapped"), limit_kib: limit / 1024 })
}

/// This process's mapped size (VmSize), in bytes.
fn vm_size() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmSize:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Focus, Target, TraceConfig};

    #[test]
    fn a_cgroup_too_small_gets_options_that_fit_in_it() {
        let config = TraceConfig::new(Target::All);
        let sizes = MapSizes::for_config(&config, false);
        let cgroup = MemoryCgroup { dir: "/sys/fs/cgroup/small".into(), limit: 64 << 20, usage: 4 << 20 };
        let reason = out_of_kernel_memory(&sizes, Some(&cgroup));
        assert!(
            reason.contains(
                "kernel memory, and sysprof's memory cgroup /sys/fs/cgroup/small allows 64 MiB, 4 MiB of \
                             it in use: raise its limit, or trace with "
            ),
            "{reason}"
        );
        assert!(check_kernel_memory(&sizes, Some(&cgroup)).is_err());
        assert!(check_kernel_memory(&sizes, None).is_ok(), "no cgroup, no limit");
        if crate::probes::BPF_OBJECT.is_empty() {
            return;
        }
        // The options named fit in the room left, with a quarter to spare.
        let stacks: u32 = option_value(&reason, "--stack-storage-size ").parse().unwrap();
        let unwind: u32 = option_value(&reason, "--unwind-memory ").parse().unwrap();
        let mut smaller = config.clone();
        (smaller.stack_storage_size, smaller.unwind_memory_mib) = (stacks, unwind);
        if reason.contains("--focus cpu") {
            smaller.focus = vec![Focus::Cpu];
        }
        let needed = kernel_memory::estimate(&MapSizes::for_config(&smaller, false));
        assert!(leaves_room(needed, cgroup.room()), "{reason}: {needed}");
        // A cgroup with no room left for any: the rest of what it holds must go.
        let full = MemoryCgroup { usage: 63 << 20, ..cgroup };
        let reason = out_of_kernel_memory(&sizes, Some(&full));
        assert!(
            reason.contains("raise its limit, or lower what else the cgroup holds: even --focus cpu"),
            "{reason}"
        );
    }

    fn option_value<'a>(text: &'a str, option: &str) -> &'a str {
        let rest = &text[text.find(option).unwrap_or_else(|| panic!("{option} in {text}")) + option.len()..];
        rest.split(' ').next().unwrap()
    }

    #[test]
    fn this_process_is_within_its_limits() {
        assert!(vm_size().is_some_and(|size| size > 0));
        // The tests run without an address-space limit, or with room.
        assert!(check_address_space().is_ok());
    }
}
