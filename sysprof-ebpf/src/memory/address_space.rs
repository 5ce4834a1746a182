//! Address-space changes: the mmap/munmap/brk/mremap calls' sizes, read from their arguments at
//! entry by the syscall program and accounted at exit (failed calls left out).

use aya_ebpf::{
    bindings::{BPF_NOEXIST, pt_regs},
    helpers::bpf_probe_read_kernel,
    macros::map,
    maps::{Array, HashMap},
};
use sysprof_common::{AddressSpace, InFlight, capacity};

use crate::{atomic, config::config};

/// Highest errno a syscall returns.
const MAX_ERRNO: i64 = 4095;

#[map]
static ADDRESS_SPACE: HashMap<u32, AddressSpace> = HashMap::with_max_entries(capacity::ADDRESS_SPACE, 0);

/// The changes of the processes `ADDRESS_SPACE` had no room for, together: an array, which
/// cannot fill (a build's thousands of processes fill the map, and the later ones' calls were
/// dropped unsaid). Their breaks are many processes', so only their brk calls are counted here,
/// not how far each moved.
#[map]
static ADDR_SPACE_REST: Array<AddressSpace> = Array::with_max_entries(1, 0);

#[inline(always)]
pub fn is_address_space_call(nr: u32) -> bool {
    let c = config();
    nr == c.nr_mmap || nr == c.nr_munmap || nr == c.nr_brk || nr == c.nr_mremap
}

/// The first three syscall arguments, from the tracepoint's `struct pt_regs *`, into `args`
/// (written in place). Not inlined: the helper's reads need stack, which would put the syscall
/// entry program on a private stack for every call (see `syscalls::syscall_enter`).
#[inline(never)]
pub fn syscall_args(regs: *const pt_regs, args: &mut [u64; 3]) {
    // SAFETY: `regs` is the syscall's register frame; the helper checks the reads.
    let read = |field: *const u64| unsafe { bpf_probe_read_kernel(field) }.unwrap_or(0);
    #[cfg(bpf_target_arch = "x86_64")]
    // SAFETY: field addresses of a valid kernel pointer, read by the helper.
    unsafe {
        args[0] = read(&raw const (*regs).rdi);
        args[1] = read(&raw const (*regs).rsi);
        args[2] = read(&raw const (*regs).rdx);
    }
    #[cfg(bpf_target_arch = "aarch64")]
    // SAFETY: as above.
    unsafe {
        args[0] = read(&raw const (*regs).regs[0]);
        args[1] = read(&raw const (*regs).regs[1]);
        args[2] = read(&raw const (*regs).regs[2]);
    }
    #[cfg(not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")))]
    {
        let _ = (regs, read);
        *args = [0; 3];
    }
}

/// Adds a finished mmap/munmap/brk/mremap (`is_address_space_call`, which the caller tests) to
/// its process's address-space totals. Not inlined, as `syscall_args`: and so called only for
/// those calls, since a call to it and its return on each of a target's system calls cost a
/// getppid loop's exit program 1.4 ns of its 39.6 (kernel statistics, default families).
#[inline(never)]
pub fn account_address_space(call: &InFlight, ret: i64) {
    let c = config();
    // brk returns the (new or unchanged) break; the others -errno on failure.
    if call.nr != c.nr_brk && (-MAX_ERRNO..0).contains(&ret) {
        return;
    }
    let (space, own) = match address_space(call.tgid) {
        Some(space) => (space, true),
        None => match ADDR_SPACE_REST.get_ptr_mut(0) {
            Some(rest) => (rest, false),
            None => return,
        },
    };
    // SAFETY: map value pointer valid for this run.
    let space = unsafe { &mut *space };
    if call.nr == c.nr_mmap {
        atomic::add(&raw mut space.mmap_calls, 1);
        atomic::add(&raw mut space.mmap_bytes, call.args[1]);
    } else if call.nr == c.nr_munmap {
        atomic::add(&raw mut space.munmap_calls, 1);
        atomic::add(&raw mut space.munmap_bytes, call.args[1]);
    } else if call.nr == c.nr_brk {
        atomic::add(&raw mut space.brk_calls, 1);
        if !own {
            return;
        }
        let new = ret as u64;
        let old = space.last_brk;
        if old != 0 && new > old {
            atomic::add(&raw mut space.brk_grow_bytes, new - old);
        } else if old != 0 && new < old {
            atomic::add(&raw mut space.brk_shrink_bytes, old - new);
        }
        space.last_brk = new;
    } else {
        atomic::add(&raw mut space.mremap_calls, 1);
        let (old, new) = (call.args[1], call.args[2]);
        if new > old {
            atomic::add(&raw mut space.mremap_grow_bytes, new - old);
        } else {
            atomic::add(&raw mut space.mremap_shrink_bytes, old - new);
        }
    }
}

#[inline(always)]
fn address_space(tgid: u32) -> Option<*mut AddressSpace> {
    if let Some(space) = ADDRESS_SPACE.get_ptr_mut(tgid) {
        return Some(space);
    }
    let _ = ADDRESS_SPACE.insert(tgid, AddressSpace::default(), BPF_NOEXIST as u64);
    ADDRESS_SPACE.get_ptr_mut(tgid)
}
