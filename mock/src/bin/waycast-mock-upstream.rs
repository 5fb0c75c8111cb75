//! `waycast-mock-upstream`: the mock OpenAI-compatible inference server as a
//! process (for the standalone quickstart and in-cluster tests).
//!
//! ```text
//! waycast-mock-upstream [--listen 127.0.0.1:8000] [--delay-ms N] [--chunks N] [--interval-ms N] [--burn-ms N]
//!                       [--vllm-slots N [--token-ms N] [--prefill-us-per-byte N] [--prefix-cache N]]
//!                       [--tls-cert FILE --tls-key FILE [--tls-client-ca FILE]]
//! waycast-mock-upstream call URL TOKEN_FILE BODY
//! ```
//!
//! Started as a gateway pod (the operator's `WAYCAST_GATEWAY` and
//! `POD_NAME` are set: a Gateway's `spec.image` names this image), it
//! ignores its arguments and serves forged usage reports on the admin port
//! (`waycast_mock::forged_usage`).
//!
//! `call` is a client inside a pod (the e2e identity tests): it POSTs
//! `BODY` (JSON) to `URL` with the token in `TOKEN_FILE` (a projected
//! ServiceAccount token) as its bearer, prints `status <code>` and the
//! answer's body, and exits 0 on any answer.
//!
//! `--vllm-slots` turns on the vLLM-like mode (`waycast_mock::vllm`);
//! `--tls-cert` and `--tls-key` serve HTTPS, and `--tls-client-ca` requires
//! client certificates signed by that CA.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use waycast_mock::upstream::{self as mock_upstream, MockOptions, Recorder};
use waycast_mock::vllm::{Engine, VllmOptions};

fn main() -> ExitCode {
    if let (Ok(_), Ok(pod), Ok(namespace)) =
        (std::env::var("WAYCAST_GATEWAY"), std::env::var("POD_NAME"), std::env::var("POD_NAMESPACE"))
    {
        return forged_gateway_pod(waycast_mock::forged_usage::Forger { pod, namespace });
    }
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    if let [call, url, token_file, body] = arguments.as_slice()
        && call == "call"
    {
        return call_once(url, token_file, body);
    }
    let mut listen: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 8000));
    let mut options = MockOptions::default();
    let mut vllm: Option<VllmOptions> = None;
    let (mut tls_cert, mut tls_key, mut tls_client_ca) = (None, None, None);
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
            ("--vllm-slots", Some(v)) => {
                v.parse().map(|n| vllm.get_or_insert_with(VllmOptions::default).slots = n).map_err(|e| e.to_string())
            }
            ("--token-ms", Some(v)) => v
                .parse()
                .map(|n| vllm.get_or_insert_with(VllmOptions::default).token_time = Duration::from_millis(n))
                .map_err(|e| e.to_string()),
            ("--prefill-us-per-byte", Some(v)) => v
                .parse()
                .map(|n| vllm.get_or_insert_with(VllmOptions::default).prefill_per_byte = Duration::from_micros(n))
                .map_err(|e| e.to_string()),
            ("--prefix-cache", Some(v)) => v
                .parse()
                .map(|n| vllm.get_or_insert_with(VllmOptions::default).cache_entries = n)
                .map_err(|e| e.to_string()),
            ("--tls-cert", Some(v)) => {
                tls_cert = Some(PathBuf::from(v));
                Ok(())
            }
            ("--tls-key", Some(v)) => {
                tls_key = Some(PathBuf::from(v));
                Ok(())
            }
            ("--tls-client-ca", Some(v)) => {
                tls_client_ca = Some(PathBuf::from(v));
                Ok(())
            }
            _ => Err(format!("unknown or incomplete argument {flag}")),
        };
        if let Err(error) = parsed {
            eprintln!(
                "waycast-mock-upstream: {error}\nusage: waycast-mock-upstream [--listen ADDR] [--delay-ms N] [--chunks N] [--interval-ms N] [--burn-ms N] [--vllm-slots N --token-ms N --prefill-us-per-byte N --prefix-cache N] [--tls-cert FILE --tls-key FILE [--tls-client-ca FILE]]"
            );
            return ExitCode::from(64);
        }
    }
    options.vllm = vllm.map(|vllm| Arc::new(Engine::new(vllm)));
    options.tls = match (tls_cert, tls_key) {
        (None, None) if tls_client_ca.is_none() => None,
        (Some(cert), Some(key)) => match waycast_mock::pki::server_tls(&cert, &key, tls_client_ca.as_deref()) {
            Ok(config) => Some(config),
            Err(error) => {
                eprintln!("waycast-mock-upstream: TLS: {error:#}");
                return ExitCode::from(64);
            }
        },
        _ => {
            eprintln!("waycast-mock-upstream: --tls-cert and --tls-key go together (and --tls-client-ca needs them)");
            return ExitCode::from(64);
        }
    };
    let scheme = if options.tls.is_some() { "https" } else { "http" };
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(listen).await {
            Ok(listener) => listener,
            Err(error) => {
                eprintln!("waycast-mock-upstream: cannot listen on {listen}: {error}");
                return ExitCode::FAILURE;
            }
        };
        eprintln!("waycast-mock-upstream: listening on {scheme}://{listen}/v1");
        let engine = options.vllm.clone();
        let serving = tokio::spawn(mock_upstream::serve(listener, Arc::new(options), Arc::new(Recorder::default())));
        waycast_mock::upstream::termination().await;
        // As an inference server drains: stop accepting (new connections
        // are refused, so a gateway retries them elsewhere), let what is
        // queued and running finish, then exit.
        serving.abort();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        match engine {
            Some(engine) => {
                while engine.busy() && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            None => tokio::time::sleep(Duration::from_secs(1)).await,
        }
        ExitCode::SUCCESS
    })
}

/// Serves forged usage reports on the gateway's admin port (9090).
fn forged_gateway_pod(forger: waycast_mock::forged_usage::Forger) -> ExitCode {
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], 9090))).await {
            Ok(listener) => listener,
            Err(error) => {
                eprintln!("waycast-mock-upstream: cannot listen on the admin port: {error}");
                return ExitCode::FAILURE;
            }
        };
        eprintln!("waycast-mock-upstream: a forged gateway pod ({}), serving forged usage reports", forger.pod);
        tokio::select! {
            served = waycast_mock::forged_usage::serve(listener, forger) => {
                eprintln!("waycast-mock-upstream: {served:?}");
                ExitCode::FAILURE
            }
            () = waycast_mock::upstream::termination() => ExitCode::SUCCESS,
        }
    })
}

/// POSTs `body` to `url` with the bearer in `token_file`; prints the
/// status and the answer.
fn call_once(url: &str, token_file: &str, body: &str) -> ExitCode {
    let token = match std::fs::read_to_string(token_file) {
        Ok(token) => token.trim().to_owned(),
        Err(error) => {
            eprintln!("waycast-mock-upstream: reading {token_file}: {error}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    runtime.block_on(async move {
        let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        let request = waycast_mock::fixtures::post_request(url, Some(&token), body);
        let answered = tokio::time::timeout(Duration::from_secs(30), http.request(request)).await;
        let response = match answered {
            Ok(Ok(response)) => response,
            Ok(Err(error)) => {
                eprintln!("waycast-mock-upstream: POST {url}: {error}");
                return ExitCode::FAILURE;
            }
            Err(_) => {
                eprintln!("waycast-mock-upstream: POST {url}: no answer within 30 s");
                return ExitCode::FAILURE;
            }
        };
        let status = response.status().as_u16();
        let body = http_body_util::BodyExt::collect(response.into_body()).await.map(|b| b.to_bytes());
        println!("status {status}");
        println!("{}", body.map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default());
        ExitCode::SUCCESS
    })
}

/// The multi-threaded runtime both modes serve on, or why not (printed).
fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|error| {
        eprintln!("waycast-mock-upstream: {error}");
        ExitCode::FAILURE
    })
}
