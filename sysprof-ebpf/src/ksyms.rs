//! Kernel addresses named by the kernel itself (see `sysprof_common::ksyms`): never attached,
//! run by userspace through BPF_PROG_TEST_RUN with the batch's size as its one argument.

use aya_ebpf::{
    macros::{map, raw_tracepoint},
    maps::Array,
    programs::RawTracePointContext,
};
use sysprof_common::ksyms::{BATCH, NAME_LEN, Name};

#[map]
static KSYM_ADDRESSES: Array<u64> = Array::with_max_entries(BATCH, 0);

#[map]
static KSYM_NAMES: Array<Name> = Array::with_max_entries(BATCH, 0);

/// The format: read-only data, as bpf_snprintf requires of it.
static FORMAT: [u8; 4] = *b"%pS\0";

#[raw_tracepoint]
pub fn kernel_symbols(ctx: RawTracePointContext) -> i32 {
    let count: u64 = ctx.arg(0);
    // SAFETY: `name_one` has the signature bpf_loop calls; it takes no context.
    unsafe {
        aya_ebpf::helpers::generated::bpf_loop(
            count.min(u64::from(BATCH)) as u32,
            name_one as *mut core::ffi::c_void,
            core::ptr::null_mut(),
            0,
        );
    }
    0
}

/// Formats the address at `index` into its name. Returns 1 to stop.
#[inline(never)]
unsafe extern "C" fn name_one(index: u64, _context: *mut core::ffi::c_void) -> i64 {
    let index = index as u32;
    let (Some(address), Some(name)) = (KSYM_ADDRESSES.get_ptr_mut(index), KSYM_NAMES.get_ptr_mut(index))
    else {
        return 1;
    };
    // SAFETY: both pointers are map values of the sizes given; the format is a NUL-terminated
    // constant; the one argument is the u64 at `address`.
    unsafe {
        aya_ebpf::helpers::generated::bpf_snprintf(
            name.cast(),
            NAME_LEN as u32,
            FORMAT.as_ptr().cast(),
            address,
            8,
        );
    }
    0
}
