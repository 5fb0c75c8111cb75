//! `.ci/reclaim-disk.sh`, which `.ci/run` runs before building:
//! with room it touches nothing; without, it removes waycast's caches in
//! order, cheapest to rebuild first, stops once there is room, and never
//! touches anything else. "Room" is faked with `WAYCAST_BUILD_ROOM_GIB`:
//! the real disk's free space decides where it stops.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// A fake target dir, cache root and Go build cache, each with what the
/// script knows, and a neighbour it must leave.
struct Fixture {
    root: PathBuf,
}

impl Fixture {
    fn new(name: &str) -> Self {
        let root = std::env::temp_dir().join(format!("waycast-reclaim-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for dir in [
            "cache/target/debug/incremental/crate-a",
            "cache/target/debug/deps",
            "cache/target/release/incremental/crate-b",
            "cache/target/profiling",
            "cache/target/bench-tool",
            "cache/src/kubernetes",
            "cache/k8s/bin",
            "cache/go-build/00",
            "users-go-build/00",
            "neighbour",
        ] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
        }
        Self { root }
    }

    fn run(&self, room_gib: i64) -> Output {
        self.run_with("cache/target", room_gib)
    }

    fn run_with(&self, target: &str, room_gib: i64) -> Output {
        Command::new("bash")
            .arg(repo().join(".ci/reclaim-disk.sh"))
            // CI's target directory lies under waycast's cache.
            .env("CARGO_TARGET_DIR", self.root.join(target))
            .env("WAYCAST_CACHE", self.root.join("cache"))
            // The user's own Go build cache: never the tool's to remove.
            .env("GOCACHE", self.root.join("users-go-build"))
            .env("WAYCAST_BUILD_ROOM_GIB", room_gib.to_string())
            .output()
            .unwrap()
    }

    fn exists(&self, path: &str) -> bool {
        self.root.join(path).exists()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

#[test]
fn with_room_nothing_is_removed() {
    let fixture = Fixture::new("room");
    // Less than no room wanted: there is room whatever the disk holds.
    let output = fixture.run(-(1 << 30));
    assert!(output.status.success(), "{output:?}");
    for path in
        ["cache/target/debug/incremental", "cache/target/release", "cache/src", "cache/go-build/00", "neighbour"]
    {
        assert!(fixture.exists(path), "{path} was removed");
    }
}

#[test]
fn without_room_only_waycasts_caches_go_in_order_and_it_says_so() {
    let fixture = Fixture::new("full");
    // More room than any disk has: every step runs, then it gives up.
    let output = fixture.run(1 << 30);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let steps = [
        "of earlier commits' build outputs",
        "removed incremental compilation caches",
        "removed release, profiling and bench-tool builds",
        "removed the project's Go build cache",
        "removed Kubernetes sources",
        "removed the whole Cargo target directory",
        "the rest of the disk is not ours",
    ];
    let at: Vec<usize> =
        steps.iter().map(|step| stderr.find(step).unwrap_or_else(|| panic!("{step}: {stderr}"))).collect();
    assert!(at.windows(2).all(|pair| pair[0] < pair[1]), "steps out of order: {stderr}");
    assert!(stderr.contains("what waycast's caches hold"), "{stderr}");
    for gone in ["cache/target/debug", "cache/target/release", "cache/src", "cache/go-build"] {
        assert!(!fixture.exists(gone), "{gone} is still there");
    }
    // The built Kubernetes binaries and anything not waycast's stay: the
    // user's own Go build cache among them.
    assert!(fixture.exists("cache/k8s/bin"));
    assert!(fixture.exists("neighbour"));
    assert!(fixture.exists("users-go-build/00"), "the user's Go build cache was removed");
}

/// A target directory shared with other projects (neither the repository's
/// own nor under waycast's cache) holds other projects' builds too: none of
/// it is removed, only waycast's own caches.
#[test]
fn a_shared_target_directory_is_left_alone() {
    let fixture = Fixture::new("shared");
    std::fs::create_dir_all(fixture.root.join("shared-target/debug/incremental/other-project")).unwrap();
    let output = fixture.run_with("shared-target", 1 << 30);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("left alone"), "{stderr}");
    assert!(fixture.exists("shared-target/debug/incremental/other-project"), "another project's build was removed");
    assert!(!fixture.exists("cache/src"), "waycast's own caches still go");
}

/// Of each artifact name in `deps`, copies more than ten minutes older
/// than the newest go (an earlier commit's test binary and its `.d`);
/// copies built together stay (two feature sets of one dependency), as do
/// names with one copy however old, and directories.
#[test]
fn earlier_commits_outputs_go_and_one_runs_stay() {
    let fixture = Fixture::new("stale");
    let deps = fixture.root.join("cache/target/debug/deps");
    let now = std::time::SystemTime::now();
    let hours_ago = |hours: u64| now - std::time::Duration::from_secs(hours * 3600);
    let files = [
        ("gateway_apis-0123456789abcdef", hours_ago(2), false),
        ("gateway_apis-0123456789abcdef.d", hours_ago(2), false),
        ("gateway_apis-fedcba9876543210", now, true),
        ("gateway_apis-fedcba9876543210.d", now, true),
        ("libserde-1111111111111111.rlib", now, true),
        ("libserde-2222222222222222.rlib", now - std::time::Duration::from_secs(300), true),
        ("libold_only-3333333333333333.rlib", hours_ago(48), true),
    ];
    for (name, modified, _) in &files {
        let file = std::fs::File::create(deps.join(name)).unwrap();
        file.set_len(1024).unwrap();
        file.set_modified(*modified).unwrap();
    }
    std::fs::create_dir_all(deps.join("a-dir-4444444444444444")).unwrap();
    let output = Command::new("python3").arg(repo().join(".ci/prune-stale-artifacts.py")).arg(&deps).output().unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "0.0", "GiB freed, to a tenth");
    for (name, _, kept) in files {
        assert_eq!(deps.join(name).exists(), kept, "{name}");
    }
    assert!(deps.join("a-dir-4444444444444444").exists());
}
