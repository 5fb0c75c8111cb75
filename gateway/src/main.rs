//! `waycast-gateway`: the data plane. Not built yet; this binary only says
//! so, and checks a config file when given one, using the shared format.

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    match (args.next().as_deref(), args.next()) {
        (Some("check-config"), Some(path)) => match std::fs::read(&path) {
            Ok(bytes) => match waycast_crds::GatewayConfig::from_slice(&bytes) {
                Ok(config) => {
                    println!(
                        "{path}: valid ({} models, {} keys)",
                        config.models.len(),
                        config.keys.len()
                    );
                    ExitCode::SUCCESS
                }
                Err(error) => {
                    eprintln!("{path}: {error}");
                    ExitCode::FAILURE
                }
            },
            Err(error) => {
                eprintln!("cannot read {path}: {error}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!(
                "waycast-gateway {}: serving is not implemented yet; `waycast-gateway check-config FILE` validates a config",
                env!("CARGO_PKG_VERSION")
            );
            ExitCode::from(64)
        }
    }
}
