//! Memory, three families of probes: page faults (`faults`), address-space changes
//! (`address_space`, called by the syscall programs) and the heap (`heap`, `--malloc`).

pub mod address_space;
pub mod faults;
pub mod heap;
