//! `xtask`: the project's developer tasks, in Rust so they run wherever
//! cargo does (the Makefile calls them):
//!
//! ```text
//! xtask crds DIR API_MD            # CRD YAML, one file per kind, and docs/api.md   (make crds)
//! xtask metrics-doc METRICS_MD     # docs/metrics.md from both binaries' registries (make generate)
//! xtask observability ROOT        # the chart's dashboards and PrometheusRule, docs/dashboards.md (make generate)
//! xtask image BINARY NAME OUT.tar  # an OCI image archive without Docker           (make images)
//! xtask compile-figures [KEYS] [MODELS] [RUNS]  # the operator's compile at scale, in memory
//! xtask memory-figures [KEYS] [MODELS]           # what a key costs the operator and a pod, in bytes
//! xtask swap-figures [KEYS] [MODELS]             # what a pod holds for its config, and what a swap adds
//! xtask structure ROOT.rs...      # no import cycle between a crate's files or top-level modules, none over 500 lines (make lint)
//! xtask structure --edges ROOT.rs # every dependency between a crate's files
//! xtask docs-check ROOT           # README.md and docs/*.md name no commit, no tracker entry (make lint)
//! ```
//!
//! Tests fail when a generated file is stale. Bad arguments exit 64.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use waycast_xtask::image::{ImageSpec, NONROOT, pack, shared_libraries};

const USAGE: &str = "usage: xtask crds DIR API_MD | metrics-doc METRICS_MD | observability ROOT | image BINARY NAME OUT.tar | compile-figures [KEYS] [MODELS] [RUNS] | memory-figures [KEYS] [MODELS] | swap-figures [KEYS] [MODELS] | structure ROOT.rs... | docs-check ROOT";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arguments: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match arguments.as_slice() {
        ["crds", dir, api_doc] => crds(Path::new(dir), Path::new(api_doc)),
        ["metrics-doc", path] => waycast_xtask::docs::metrics_reference()
            .and_then(|text| std::fs::write(path, text).with_context(|| format!("writing {path}"))),
        ["observability", root] => observability(Path::new(root)),
        ["image", binary, name, out] => image(binary, name, Path::new(out)),
        ["compile-figures", numbers @ ..] => match sizes(numbers, &[10_000, 500, 5]) {
            Some([keys, models, runs]) => compile_figures(keys, models, runs.max(1)),
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(64);
            }
        },
        ["memory-figures", numbers @ ..] => match sizes(numbers, &[10_000, 500]) {
            Some([keys, models]) => memory_figures(keys, models),
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(64);
            }
        },
        ["swap-figures", "--from", dir] => swap_figures_from(Path::new(dir)),
        ["swap-figures", numbers @ ..] => match sizes(numbers, &[10_000, 500]) {
            Some([keys, models]) => swap_figures(keys, models),
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(64);
            }
        },
        ["structure", "--edges", root] => structure_edges(root),
        ["structure", roots @ ..] if !roots.is_empty() => structure(roots),
        ["docs-check", root] => docs_check(Path::new(root)),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(64);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn crds(dir: &Path, api_doc: &Path) -> anyhow::Result<()> {
    for (file_name, yaml) in waycast_crds::crd_yaml_documents().context("rendering the CRDs")? {
        let path = dir.join(file_name);
        std::fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
    }
    let reference = waycast_crds::docs::api_reference(&waycast_crds::crds());
    std::fs::write(api_doc, reference).with_context(|| format!("writing {}", api_doc.display()))
}

fn observability(root: &Path) -> anyhow::Result<()> {
    let mut files = waycast_xtask::observability::generated()?;
    files.push(("docs/dashboards.md".to_owned(), waycast_xtask::observability::dashboards_doc()));
    for (path, text) in files {
        let path = root.join(path);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn structure(roots: &[&str]) -> anyhow::Result<()> {
    let mut failed = false;
    for root in roots {
        let problems = waycast_xtask::structure::problems(Path::new(root))?;
        for problem in &problems {
            eprintln!("{root}: {problem}");
        }
        failed |= !problems.is_empty();
    }
    anyhow::ensure!(!failed, "the source's shape needs fixing (see above)");
    Ok(())
}

fn docs_check(root: &Path) -> anyhow::Result<()> {
    let problems = waycast_xtask::docs_check::check(root)?;
    for problem in &problems {
        eprintln!("{problem}");
    }
    anyhow::ensure!(
        problems.is_empty(),
        "docs are reference: move runs and comparisons to CHANGELOG.md or bench/LOG.md"
    );
    Ok(())
}

/// Every dependency between the crate's files, for finding a way out of a
/// cycle.
fn structure_edges(root: &str) -> anyhow::Result<()> {
    let graph = waycast_xtask::structure::ModuleGraph::read(Path::new(root))?;
    for (from, targets) in &graph.edges {
        for (to, paths) in targets {
            let shown: Vec<&str> = paths.iter().map(String::as_str).take(4).collect();
            println!("{} → {} ({})", graph.modules[*from].name(), graph.modules[*to].name(), shown.join(", "));
        }
    }
    Ok(())
}

fn image(binary: &str, name: &str, out: &Path) -> anyhow::Result<()> {
    let spec = ImageSpec { name: name.to_owned(), binary: PathBuf::from(binary), args: vec![], user: NONROOT };
    let digest = pack(&spec, out)?;
    let size = |path: &Path| std::fs::metadata(path).map(|m| m.len()).unwrap_or_default();
    let libraries: u64 = shared_libraries(&spec.binary)?.iter().map(|l| size(l)).sum();
    println!(
        "{name}: {} {digest}\n  image {:.1} MiB = binary {:.1} MiB + shared libraries {:.1} MiB + metadata",
        out.display(),
        mib(size(out)),
        mib(size(&spec.binary)),
        mib(libraries)
    );
    Ok(())
}

/// Times the operator's pure compile and render of one Gateway with many
/// ApiKeys and ModelEndpoints (no API server) and prints JSON. Kept here, not
/// in `waycast-bench`, so the user-facing load generator does not build the
/// operator.
/// `numbers` parsed, each missing one taken from `defaults`; `None` when
/// one does not parse or there are more than `defaults`.
fn sizes<const N: usize>(numbers: &[&str], defaults: &[usize; N]) -> Option<[usize; N]> {
    if numbers.len() > N {
        return None;
    }
    let mut sizes = *defaults;
    for (size, number) in sizes.iter_mut().zip(numbers) {
        *size = number.parse().ok()?;
    }
    Some(sizes)
}

fn compile_figures(keys: usize, models: usize, runs: usize) -> anyhow::Result<()> {
    let fleet = waycast_xtask::scale::fleet("bench", keys, models, "http://127.0.0.1:8000/v1");
    let figures = waycast_xtask::scale::compile_figures(&fleet, runs)?;
    println!("{}", serde_json::to_string_pretty(&figures)?);
    Ok(())
}

#[allow(clippy::cast_precision_loss, reason = "sizes for display")]
fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Counts live bytes and their peak (what `memory-figures` and
/// `swap-figures` read); no limit.
#[global_allocator]
static ALLOCATOR: cap::Cap<std::alloc::System> = cap::Cap::new(std::alloc::System, usize::MAX);

fn memory_figures(keys: usize, models: usize) -> anyhow::Result<()> {
    let fleet = waycast_xtask::scale::fleet("scale", keys, models, "http://10.96.0.10:8000/v1");
    let costs = waycast_xtask::memory::memory_figures(&|| ALLOCATOR.allocated(), &fleet)?;
    println!("{}", serde_json::to_string_pretty(&costs)?);
    Ok(())
}

/// Writes the two configs of a swap, then measures the swap in a process
/// of its own: the allocator's peak there is the swap's, not the fleet's
/// that made the configs.
fn swap_figures(keys: usize, models: usize) -> anyhow::Result<()> {
    let fleet = waycast_xtask::scale::fleet("scale", keys, models, "http://10.96.0.10:8000/v1");
    let (first, second) = waycast_xtask::memory::swap_configs(&fleet)?;
    drop(fleet);
    let dir = std::env::temp_dir().join(format!("waycast-swap-figures-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("first.json"), first)?;
    std::fs::write(dir.join("second.json"), second)?;
    let status = std::process::Command::new(std::env::current_exe()?)
        .args(["swap-figures", "--from"])
        .arg(&dir)
        .status()
        .context("running the swap in a process of its own")?;
    std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    anyhow::ensure!(status.success(), "the swap's process failed: {status}");
    Ok(())
}

fn swap_figures_from(dir: &Path) -> anyhow::Result<()> {
    let read = |name: &str| std::fs::read(dir.join(name)).with_context(|| format!("reading {name}"));
    let (first, second) = (read("first.json")?, read("second.json")?);
    let figures =
        waycast_xtask::memory::swap_figures(&|| ALLOCATOR.allocated(), &|| ALLOCATOR.max_allocated(), &first, &second)?;
    println!("{}", serde_json::to_string_pretty(&figures)?);
    Ok(())
}
