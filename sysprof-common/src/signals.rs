//! The signal family's shared types: signals delivered to the target's threads, counted in the
//! kernel by signal, by who sent it and by what the target did with it.

/// Key of the signal counts.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SignalKey {
    pub tgid: u32,
    /// The signal number (`SIGUSR1`...).
    pub signal: u32,
    /// Who sent it: one of [`origin`].
    pub origin: u32,
    /// What the target's disposition was: one of [`action`].
    pub action: u32,
}
shared!(SignalKey, 16);

/// Who sent a signal, from its `si_code`.
pub mod origin {
    /// A process: kill, tgkill (raise), sigqueue (`si_code` SI_USER, SI_TKILL, SI_QUEUE).
    pub const PROCESS: u32 = 0;
    /// A POSIX timer (`timer_create`, SI_TIMER).
    pub const TIMER: u32 = 1;
    /// The kernel: a fault (SIGSEGV, SIGBUS, SIGFPE), a child's exit, I/O readiness,
    /// `alarm`/`setitimer` (SI_KERNEL and the positive codes).
    pub const KERNEL: u32 = 2;
}

/// The disposition a delivered signal met, from its `sa_handler`.
pub mod action {
    /// SIG_DFL: the default action (terminate, core, stop, continue, or ignore).
    pub const DEFAULT: u32 = 0;
    /// SIG_IGN.
    pub const IGNORED: u32 = 1;
    /// A handler of the target's own ran.
    pub const HANDLER: u32 = 2;
}

/// Hash: [`SignalKey`] -> signals delivered.
pub const SIGNALS: &str = "SIGNALS";
/// Per-CPU array of one `u64`: signals not counted because [`SIGNALS`] was full.
pub const SIGNALS_LOST: &str = "SIGNALS_LOST";
/// Entries of [`SIGNALS`].
pub const CAPACITY: u32 = 4096;
