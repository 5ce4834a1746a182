//! The `sysprof` command: parses the command line, runs the library, prints the outcome.

use std::process::ExitCode;

use clap::Parser as _;
use sysprof::{
    cli::{Cli, Command},
    error::Error,
    terminal::stderr_line,
};

fn main() -> ExitCode {
    // One malloc arena for all of sysprof's threads: none allocates much at a time, and glibc's
    // arena per thread each kept the memory freed in it (4 MB of a 10 s --all trace's peak).
    // Blocks of 128 KiB and more (the report's tables, the rendered files, the stacks' vectors
    // as they grow) mapped on their own and given back when freed: glibc otherwise raises that
    // bound to the largest block freed so far and carves later ones from the heap, where what
    // they leave between smaller blocks stays resident (a 10 s --all trace beside make -j2:
    // peak RSS 56 MB -> 47 MB).
    #[cfg(target_env = "gnu")]
    // SAFETY: called before any other thread exists; it only sets allocator parameters.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
    if let Some(limit) = sysprof::limits::address_space_limit() {
        address_space_panics(limit);
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Trace(args) => match args.into_config() {
            Ok(config) => sysprof::trace(config).map(|outcome| outcome.exit_code),
            Err(usage) => {
                stderr_line(format_args!("{usage}"));
                return ExitCode::from(2);
            }
        },
        Command::Report(args) => sysprof::rerender(&args.dir, args.output.as_deref(), &args.focus),
        Command::Merge(args) => sysprof::merge::run(&args.dirs, &args.output),
        Command::Check(args) => sysprof::check::run(args.json, args.nvml_lib.as_deref()),
        Command::Topo(args) => sysprof::gpu::nvml::topo(args.nvml_lib.as_deref(), args.json),
        Command::Tables(args) => sysprof::unwind::describe_tables(&args.files, args.json, args.verify),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            // One line, the whole chain: "what failed: why", with the fix in the message.
            stderr_line(format_args!("error: {error:#}"));
            match error.downcast_ref::<Error>() {
                Some(Error::InterruptedAtStart { code, .. }) => ExitCode::from(*code),
                _ => ExitCode::FAILURE,
            }
        }
    }
}

/// Under an address-space limit (`ulimit -v`), a thread or a mapping the limit refuses past the
/// start's check (`limits::check_address_space`; a large file mapped to be symbolized, say)
/// panics in the standard library or tokio: said in one line, with the limit and its fix, and
/// the process ends at once, rather than a backtrace and a runtime left waiting for the thread
/// that panicked (both seen under `ulimit -v 35000`). The kernel detaches the probes with it.
fn address_space_panics(limit: u64) {
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("a panic");
        let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        let error =
            Error::AddressSpace { what: format!("sysprof stopped ({message}{at})"), limit_kib: limit / 1024 };
        stderr_line(format_args!("error: {error}"));
        std::process::exit(1);
    }));
}
