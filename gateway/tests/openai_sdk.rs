//! The official OpenAI Python SDK works unchanged against the gateway: a
//! chat completion, a streamed one with `stream_options.include_usage`,
//! `models.list()`, the SDK's own error classes for our errors, and audio
//! (the SDK's own multipart forms) and images.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on any unexpected error")]

mod support;

use std::path::Path;
use std::process::Command;

use support::{Fixture, FixtureOptions};
use waycast_mock::fixtures::ALICE_KEY;

#[tokio::test]
async fn the_official_python_sdk_works_unchanged() {
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let setup = Command::new("bash").arg(tests.join("python-env.sh")).output().unwrap();
    assert!(setup.status.success(), "python env setup failed: {}", String::from_utf8_lossy(&setup.stderr));
    let python = String::from_utf8(setup.stdout).unwrap().trim().to_owned();

    let fixture = Fixture::start(FixtureOptions::default(), |_, _| {}).await;
    let base_url = fixture.url("/v1");
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python).arg(tests.join("openai_sdk.py")).args([&base_url, ALICE_KEY]).output().unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "SDK checks failed:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    for check in [
        "chat completion ok",
        "streamed chat completion with usage ok",
        "models.list ok",
        "authentication error ok",
        "unknown model error ok",
        "audio transcription and translation ok",
        "speech and images ok",
    ] {
        assert!(stdout.contains(check), "missing {check:?} in:\n{stdout}");
    }
}
