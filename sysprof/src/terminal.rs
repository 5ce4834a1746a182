//! Lines for the person at the terminal. Status and summary lines must never cost the results:
//! a closed pipe (`| head`), a full device (`2>/dev/full`) or a lost terminal makes every write
//! here a no-op instead of a panic, so the trace goes on and its files are still written.

use std::{fmt, io::Write as _};

/// `sysprof: ...` on stderr; write errors are dropped (see the module docs).
macro_rules! say {
    ($($arg:tt)*) => { $crate::terminal::stderr_line(format_args!("sysprof: {}", format_args!($($arg)*))) };
}
pub(crate) use say;

/// One line on stderr, as is.
pub fn stderr_line(args: fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "{args}");
}

/// Text on stdout (`sysprof check`, `sysprof topo`): a reader that went away ends nothing but
/// the output.
pub fn stdout_text(text: &str) {
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}
