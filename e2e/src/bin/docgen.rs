//! Writes the generated reference docs that span crates:
//! `docgen docs/metrics.md`. A test fails when the committed file is stale.

use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(path) = std::env::args_os().nth(1) else {
        eprintln!("usage: docgen METRICS_MD");
        return ExitCode::from(64);
    };
    let reference = match waycast_e2e::docs::metrics_reference() {
        Ok(reference) => reference,
        Err(error) => {
            eprintln!("docgen: {error:#}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(error) = std::fs::write(&path, reference) {
        eprintln!("docgen: cannot write {}: {error}", path.to_string_lossy());
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
