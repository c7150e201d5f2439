//! `scopegate guards report`: prints the guard report of the library this binary was built
//! from, as the compiled walk wrote it while rustc compiled the library. It never re-runs the
//! guard and never reads the sources.

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

use super::CliError;

use crate::admin::report::{self, ReportFormat};

#[derive(Debug, Args)]
pub struct GuardsArgs {
    #[command(subcommand)]
    command: GuardsCommand,
}

#[derive(Debug, Subcommand)]
enum GuardsCommand {
    /// Print the guard report of this build: the guard table, each tool's dependency tree,
    /// the findings (none, or the build would have failed) and the residue the walk can't see.
    Report(ReportArgs),
}

#[derive(Debug, Args)]
struct ReportArgs {
    /// md for auditors, json (see guards/report.schema.json), sarif (SARIF 2.1.0).
    #[arg(long, value_enum, default_value_t = Format::Md)]
    format: Format,
    /// Write the report to FILE instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    Md,
    Json,
    Sarif,
}

/// Why the report could not be written.
#[derive(Debug, thiserror::Error)]
#[error("writing the guard report to {path}: {source}")]
pub struct ReportError {
    path: String,
    source: std::io::Error,
}

fn text(format: Format) -> Option<&'static str> {
    report::text(match format {
        Format::Md => ReportFormat::Md,
        Format::Json => ReportFormat::Json,
        Format::Sarif => ReportFormat::Sarif,
    })
}

pub fn run(args: GuardsArgs) -> Result<(), CliError> {
    let GuardsCommand::Report(args) = args.command;
    let text = text(args.format).ok_or(CliError::NoGuardReport)?;
    let written = match &args.output {
        Some(path) => {
            std::fs::write(path, text).map_err(|source| ReportError { path: path.display().to_string(), source })
        }
        None => match std::io::stdout().lock().write_all(text.as_bytes()) {
            // `| head` closing the pipe early is not a failure of the report.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            other => other.map_err(|source| ReportError { path: "stdout".into(), source }),
        },
    };
    Ok(written?)
}
