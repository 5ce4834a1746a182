//! The `sysprof` command: parses the command line, runs the library, prints the outcome.

use std::process::ExitCode;

use clap::Parser as _;
use sysprof::{
    cli::{Cli, Command},
    error::Error,
    terminal::stderr_line,
};

fn main() -> ExitCode {
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
        Command::Tables(args) => sysprof::unwind::describe_tables(&args.files, args.json),
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
