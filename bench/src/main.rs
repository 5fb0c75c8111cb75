//! `waycast-bench`: how fast is waycast on your setup?
//!
//! ```text
//! waycast-bench sink  --listen 127.0.0.1:8000                    # the OpenAI-compatible sink alone
//! waycast-bench run   --target http://GATEWAY --key KEY [--baseline http://SERVER --rounds 5] [--sweep 10:100:10] [...]
//! waycast-bench serve --listen 127.0.0.1:8090 [--allowed-target gateway]  # REST API + web page + sink
//! waycast-bench suite --gateway target/release/waycast-gateway    # what `make bench` runs
//! waycast-bench peers --waycast ... --nginx ... --onwards ...        # what `make bench-peers` runs
//! ```
//!
//! Bad arguments exit 64.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use waycast_bench::access::{Targets, Tokens};
use waycast_bench::peers::{Peer, PeerKind};
use waycast_bench::sink::SinkOptions;
use waycast_bench::{Scenario, millis, peers, server, sink, study, suite};

#[derive(Parser, Debug)]
#[command(name = "waycast-bench", version, about = "Benchmark an OpenAI-compatible gateway against a sink")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve only the sink.
    Sink {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8000")]
        listen: SocketAddr,
        #[command(flatten)]
        answers: Answers,
    },
    /// Start runs over a REST API (POST /runs, GET /runs/ID), with a web page at / and the sink at /v1.
    Serve {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8090")]
        listen: SocketAddr,
        /// A host name the REST API answers to besides IP addresses and
        /// localhost (a Service's or an Ingress's; repeat for several).
        #[arg(long = "allowed-host")]
        allowed_hosts: Vec<String>,
        /// A target runs may load besides loopback: `HOST` (any port) or
        /// `HOST:PORT`, compared as written (repeat for several).
        #[arg(long = "allowed-target")]
        allowed_targets: Vec<String>,
        /// A file of tokens the REST API accepts, one a line (each
        /// holder's runs are their own); absent: one is drawn at start and
        /// printed.
        #[arg(long, env = "WAYCAST_BENCH_TOKEN_FILE")]
        token_file: Option<PathBuf>,
        #[command(flatten)]
        answers: Answers,
    },
    /// One run (with a baseline, in rounds, or a rate sweep); prints a table, and the report as JSON on stdout.
    Run {
        #[command(flatten)]
        scenario: Scenario,
        /// Also write the report as JSON to this file.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Also write the report as CSV to this file.
        #[arg(long)]
        csv: Option<PathBuf>,
    },
    /// The `make bench` suite: every scenario against the sink and through a gateway process.
    Suite {
        /// The gateway binary (use a release build).
        #[arg(long)]
        gateway: PathBuf,
        /// Where to write the JSON report.
        #[arg(long, default_value = "bench.json")]
        out: PathBuf,
        /// Multiplies request counts (e.g. 0.1 for a quick look).
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
        /// CPU to pin the gateway to.
        #[arg(long)]
        gateway_cpu: Option<usize>,
        /// CPU to pin the sink to (run the suite itself there with taskset).
        #[arg(long)]
        load_cpu: Option<usize>,
        /// Give the key generous rate limits (never reached): every request
        /// pays for the limit check.
        #[arg(long)]
        limits: bool,
        /// Only the request-response scenarios of this id (e.g. `S9`), without
        /// S5's cold starts and S8's held streams.
        #[arg(long)]
        only: Option<String>,
    },
    /// Mints a bearer token for load (an issuer of its own, ES256): prints
    /// the token and writes the issuer's key set, for a gateway config's
    /// `providers[].keySet` (the instruction counts of a token's requests).
    IssueToken {
        /// The issuer (`iss`).
        #[arg(long, default_value = "https://sso.bench.invalid")]
        issuer: String,
        /// The audience (`aud`).
        #[arg(long, default_value = "waycast")]
        audience: String,
        /// Who it names (`sub`).
        #[arg(long, default_value = "bench-user")]
        subject: String,
        /// A group it lists (repeat for several).
        #[arg(long = "group")]
        groups: Vec<String>,
        /// Seconds it stays valid.
        #[arg(long, default_value_t = 3600)]
        valid_seconds: i64,
        /// Where to write the key set (JWKS).
        #[arg(long)]
        jwks_out: PathBuf,
    },
    /// The `make bench-peers` run: waycast and other proxies, in turn, on the same CPUs, sinks and load.
    Peers {
        /// The waycast gateway binary (a release build).
        #[arg(long)]
        waycast: Option<PathBuf>,
        /// nginx (Debian's `/usr/sbin/nginx`).
        #[arg(long)]
        nginx: Option<PathBuf>,
        /// onwards (from `cargo install onwards`).
        #[arg(long)]
        onwards: Option<PathBuf>,
        /// LiteLLM's `litellm` command (from `pip install 'litellm[proxy]'`).
        #[arg(long)]
        litellm: Option<PathBuf>,
        /// CPUs each peer is pinned to (a taskset list: 0, 0-3); each runs one worker per CPU.
        #[arg(long, default_value = "0")]
        peer_cpus: String,
        /// CPUs the sinks are pinned to (run the bench itself there with taskset).
        #[arg(long)]
        load_cpus: Option<String>,
        /// Seconds per timed cell, roughly.
        #[arg(long, default_value_t = 15.0)]
        cell_seconds: f64,
        /// Streams held open at once.
        #[arg(long, default_value_t = 1_000)]
        held_streams: u64,
        /// Rounds of the timed cells, taking the peers in turn (the table shows medians).
        #[arg(long, default_value_t = 3)]
        rounds: u32,
        /// Where to write the JSON report.
        #[arg(long, default_value = "bench-peers.json")]
        out: PathBuf,
    },
}

/// Defaults of the sink's answers (requests override them with x-bench-* headers).
#[derive(clap::Args, Debug)]
struct Answers {
    /// Wait before answering, in ms.
    #[arg(long, default_value_t = 0)]
    wait_ms: u64,
    /// Chunks per stream.
    #[arg(long, default_value_t = 20)]
    chunks: u32,
    /// Pause between stream chunks, in ms.
    #[arg(long, default_value_t = 0)]
    chunk_interval_ms: u64,
}

impl Answers {
    fn options(&self) -> SinkOptions {
        SinkOptions { wait: millis(self.wait_ms), chunks: self.chunks.max(1), interval: millis(self.chunk_interval_ms) }
    }
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(error) => {
            let code = if error.use_stderr() { 64 } else { 0 };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("waycast-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        match args.command {
            Command::Sink { listen, answers } => match sink::start(listen, answers.options()).await {
                Ok(address) => {
                    eprintln!("waycast-bench: sink on http://{address}");
                    wait_for_signal().await
                }
                Err(error) => fail(&format!("cannot listen on {listen}: {error}")),
            },
            Command::Serve { listen, allowed_hosts, allowed_targets, token_file, answers } => {
                serve(listen, allowed_hosts, allowed_targets, token_file, answers).await
            }
            Command::Run { scenario, out, csv } => {
                if let Err(problem) = scenario.validate() {
                    eprintln!("waycast-bench: {problem}");
                    return ExitCode::from(64);
                }
                match study::run(scenario, |now| eprintln!("waycast-bench: {now}")).await {
                    Ok(report) => {
                        eprint!("{}", study::table(&report));
                        let json = serde_json::to_string_pretty(&report).unwrap_or_default();
                        println!("{json}");
                        for (path, text) in [(out, json), (csv, waycast_bench::csv::report(&report))] {
                            if let Some(path) = path
                                && let Err(error) = std::fs::write(&path, text)
                            {
                                return fail(&format!("cannot write {}: {error}", path.display()));
                            }
                        }
                        if study::errors(&report) > 0 { ExitCode::from(1) } else { ExitCode::SUCCESS }
                    }
                    Err(problem) => fail(&problem),
                }
            }
            Command::IssueToken { issuer, audience, subject, groups, valid_seconds, jwks_out } => {
                let minted = waycast_mock::tokens::TestIssuer::new(&issuer, "bench-1");
                let now = jiff::Timestamp::now().as_second();
                let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
                let token = minted.token(&minted.claims(&subject, &audience, &groups, now, now + valid_seconds));
                if let Err(error) = std::fs::write(&jwks_out, minted.jwks()) {
                    return fail(&format!("cannot write {}: {error}", jwks_out.display()));
                }
                println!("{token}");
                ExitCode::SUCCESS
            }
            Command::Suite { gateway, out, scale, gateway_cpu, load_cpu, limits, only } => {
                let bench = match std::env::current_exe() {
                    Ok(path) => path,
                    Err(error) => return fail(&format!("cannot find myself: {error}")),
                };
                let options = suite::SuiteOptions {
                    gateway,
                    bench,
                    out: out.clone(),
                    scale,
                    gateway_cpu,
                    load_cpu,
                    gateway_log: "info".into(),
                    limits,
                    only,
                };
                match suite::run(options).await {
                    Ok(report) => {
                        print!("{}", suite::table(&report));
                        write_report(&report, &out)
                    }
                    Err(error) => fail(&format!("{error:#}")),
                }
            }
            Command::Peers {
                waycast,
                nginx,
                onwards,
                litellm,
                peer_cpus,
                load_cpus,
                cell_seconds,
                held_streams,
                rounds,
                out,
            } => {
                let bench = match std::env::current_exe() {
                    Ok(path) => path,
                    Err(error) => return fail(&format!("cannot find myself: {error}")),
                };
                let peers: Vec<Peer> = [
                    (PeerKind::Waycast, waycast),
                    (PeerKind::Nginx, nginx),
                    (PeerKind::Onwards, onwards),
                    (PeerKind::Litellm, litellm),
                ]
                .into_iter()
                .filter_map(|(kind, program)| program.map(|program| Peer { kind, program }))
                .collect();
                if peers.is_empty() {
                    eprintln!("waycast-bench: name at least one peer (--waycast, --nginx, --onwards, --litellm)");
                    return ExitCode::from(64);
                }
                let options = peers::PeersOptions {
                    peers,
                    bench,
                    peer_cpus,
                    load_cpus,
                    cell_seconds,
                    held_streams,
                    rounds: rounds.max(1),
                };
                match peers::run(options).await {
                    Ok(report) => {
                        print!("{}", peers::table(&report));
                        write_report(&report, &out)
                    }
                    Err(error) => fail(&format!("{error:#}")),
                }
            }
        }
    })
}

/// `waycast-bench serve`: its tokens and allow-list set up, listening,
/// the page's address printed (with the token, when drawn here).
async fn serve(
    listen: SocketAddr,
    allowed_hosts: Vec<String>,
    allowed_targets: Vec<String>,
    token_file: Option<PathBuf>,
    answers: Answers,
) -> ExitCode {
    // The names this server answers to are targets too: its own sink.
    let targets = match Targets::new(&[allowed_targets, allowed_hosts.clone()].concat()) {
        Ok(targets) => targets,
        Err(error) => return usage(&error.to_string()),
    };
    let (tokens, drawn) = match &token_file {
        // Read at most one byte past the bound: a path such as /dev/zero
        // costs nothing before it is refused.
        Some(path) => match read_at_most(path, 256 * 1024 + 1) {
            Ok(bytes) if bytes.len() <= 256 * 1024 => match Tokens::from_text(&String::from_utf8_lossy(&bytes)) {
                Ok(tokens) => (tokens, None),
                Err(error) => return usage(&format!("{}: {error}", path.display())),
            },
            Ok(_) => return usage(&format!("{}: a token file is at most 256 KiB", path.display())),
            Err(error) => return usage(&format!("cannot read {}: {error}", path.display())),
        },
        None => match Tokens::generate() {
            Ok((tokens, token)) => (tokens, Some(token)),
            Err(error) => return fail(&error.to_string()),
        },
    };
    let options = server::ServeOptions { sink: answers.options(), allowed_hosts, targets, tokens };
    let address = match server::start(listen, options).await {
        Ok(address) => address,
        Err(error) => return fail(&format!("cannot listen on {listen}: {error}")),
    };
    // Listening on every address: the page is at loopback on this machine (or a port-forward).
    let shown = if address.ip().is_unspecified() {
        SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), address.port())
    } else {
        address
    };
    // NB: the token goes in the fragment, which a browser never sends, so
    // no access log or proxy between sees it.
    match drawn {
        Some(token) => eprintln!(
            "waycast-bench: http://{shown}/#token={token} (REST API at /runs with Authorization: Bearer {token}, sink at /v1)"
        ),
        None => eprintln!(
            "waycast-bench: http://{shown}/#token=YOUR_TOKEN (a token of {}; REST API at /runs with Authorization: Bearer YOUR_TOKEN, sink at /v1)",
            token_file.as_deref().map(std::path::Path::display).map(|p| p.to_string()).unwrap_or_default()
        ),
    }
    wait_for_signal().await
}

fn usage(message: &str) -> ExitCode {
    eprintln!("waycast-bench: {message}");
    ExitCode::from(64)
}

fn write_report(report: &impl serde::Serialize, out: &std::path::Path) -> ExitCode {
    match serde_json::to_vec_pretty(report).map(|json| std::fs::write(out, json)) {
        Ok(Ok(())) => {
            println!("written to {}", out.display());
            ExitCode::SUCCESS
        }
        _ => fail(&format!("cannot write {}", out.display())),
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("waycast-bench: {message}");
    ExitCode::FAILURE
}

/// Resolves on SIGTERM or SIGINT.
async fn wait_for_signal() -> ExitCode {
    waycast_mock::upstream::termination().await;
    ExitCode::SUCCESS
}

/// Up to `limit` bytes of the file at `path`.
fn read_at_most(path: &std::path::Path, limit: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?.take(limit).read_to_end(&mut bytes)?;
    Ok(bytes)
}
