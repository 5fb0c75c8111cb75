//! `waycast-mock-upstream`: the mock OpenAI-compatible inference server as a
//! process (for the standalone quickstart and in-cluster tests).
//!
//! ```text
//! waycast-mock-upstream [--listen 127.0.0.1:8000] [--delay-ms N] [--chunks N] [--interval-ms N] [--burn-ms N]
//! ```

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use waycast_mock::upstream::{self as mock_upstream, MockOptions, Recorder};

fn main() -> ExitCode {
    let mut listen: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 8000));
    let mut options = MockOptions::default();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next();
        let parsed = match (flag.as_str(), value.as_deref()) {
            ("--listen", Some(v)) => v.parse().map(|a| listen = a).map_err(|e| e.to_string()),
            ("--delay-ms", Some(v)) => {
                v.parse().map(|n| options.delay = Duration::from_millis(n)).map_err(|e| e.to_string())
            }
            ("--chunks", Some(v)) => v.parse().map(|n| options.chunks = n).map_err(|e| e.to_string()),
            ("--burn-ms", Some(v)) => {
                v.parse().map(|n| options.burn = Duration::from_millis(n)).map_err(|e| e.to_string())
            }
            ("--interval-ms", Some(v)) => {
                v.parse().map(|n| options.interval = Duration::from_millis(n)).map_err(|e| e.to_string())
            }
            _ => Err(format!("unknown or incomplete argument {flag}")),
        };
        if let Err(error) = parsed {
            eprintln!(
                "waycast-mock-upstream: {error}\nusage: waycast-mock-upstream [--listen ADDR] [--delay-ms N] [--chunks N] [--interval-ms N]"
            );
            return ExitCode::from(64);
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("waycast-mock-upstream: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(listen).await {
            Ok(listener) => listener,
            Err(error) => {
                eprintln!("waycast-mock-upstream: cannot listen on {listen}: {error}");
                return ExitCode::FAILURE;
            }
        };
        eprintln!("waycast-mock-upstream: listening on http://{listen}/v1");
        tokio::select! {
            () = mock_upstream::serve(listener, Arc::new(options), Arc::new(Recorder::default())) => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        ExitCode::SUCCESS
    })
}
