//! Docs are reference, checked by `make lint`: README.md and docs/*.md say
//! what is true today, so they name no commit and no tracker entry (runs and
//! build comparisons belong in CHANGELOG.md or bench/LOG.md, which this
//! check does not read).
//!
//! ```text
//! each line ─► words of 7–12 or 40 hex digits with a letter and a digit (a commit)
//!           ─► "issue 46", "issues #46", "PR 46", a bare "#46"       (a tracker entry)
//! ```
//!
//! A SHA-256 digest (64 hex digits, as in `sha256:…` examples), a trace or
//! span id (32 or 16), an elided example id (`4bf92f35…`) and words with any
//! other letter (`e2e`, `h2c`) pass.

use std::path::Path;

use anyhow::Context as _;

/// Runs of hex digits read as a commit hash: abbreviated (git's 7 and up)
/// or whole.
const SHORT_COMMIT: std::ops::RangeInclusive<usize> = 7..=12;
const WHOLE_COMMIT: usize = 40;

/// Words before a number that make it a tracker entry.
const TRACKER_WORDS: [&str; 5] = ["issue", "issues", "pr", "prs", "ticket"];

/// What in `text` looks like a commit hash or a tracker reference, as
/// `line: what` for each hit.
pub fn problems(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let words: Vec<(usize, &str)> = words(line).collect();
        for (i, &(at, word)) in words.iter().enumerate() {
            let elided = line[at + word.len()..].starts_with('…');
            if looks_like_commit(word) && !elided {
                found.push(format!("{}: `{word}` looks like a commit hash", number + 1));
            }
            if !word.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let hashed = at > 0 && line.as_bytes()[at - 1] == b'#';
            // `&#123;` is an HTML character reference and `x.md#100-keys`
            // a link's anchor, not tracker entries.
            let anchored = at > 1 && {
                let before = line.as_bytes()[at - 2];
                before.is_ascii_alphanumeric() || matches!(before, b'&' | b'/' | b'.' | b'_' | b'-')
            };
            let named = i > 0 && TRACKER_WORDS.contains(&words[i - 1].1.to_ascii_lowercase().as_str());
            if (hashed && !anchored) || named {
                found.push(format!("{}: `{}` looks like a tracker reference", number + 1, reference(line, &words, i)));
            }
        }
    }
    found
}

/// Every README.md and docs/*.md hit under the repository `root`, as
/// `file:line: what`.
///
/// # Errors
/// A doc that cannot be read.
pub fn check(root: &Path) -> anyhow::Result<Vec<String>> {
    let mut files = vec![root.join("README.md")];
    let docs = root.join("docs");
    for entry in std::fs::read_dir(&docs).with_context(|| format!("reading {}", docs.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|extension| extension == "md") {
            files.push(path);
        }
    }
    files.sort();
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        let shown = file.strip_prefix(root).unwrap_or(&file).display().to_string();
        found.extend(problems(&text).into_iter().map(|problem| format!("{shown}:{problem}")));
    }
    Ok(found)
}

/// The line's words (runs of ASCII letters, digits and `_`: an identifier
/// such as `wc_4f9a2b7c` is one word) with their offsets.
fn words(line: &str) -> impl Iterator<Item = (usize, &str)> {
    let bytes = line.as_bytes();
    let mut at = 0;
    std::iter::from_fn(move || {
        while at < bytes.len() && !is_word(bytes[at]) {
            at += 1;
        }
        let start = at;
        while at < bytes.len() && is_word(bytes[at]) {
            at += 1;
        }
        (at > start).then(|| (start, &line[start..at]))
    })
}

fn is_word(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_'
}

fn looks_like_commit(word: &str) -> bool {
    (SHORT_COMMIT.contains(&word.len()) || word.len() == WHOLE_COMMIT)
        && word.bytes().all(|b| b.is_ascii_hexdigit())
        && word.bytes().any(|b| b.is_ascii_digit())
        && word.bytes().any(|b| b.is_ascii_alphabetic())
}

/// The hit as it reads: `#46`, or `issue 46`.
fn reference(line: &str, words: &[(usize, &str)], i: usize) -> String {
    let (at, word) = words[i];
    match i.checked_sub(1).map(|before| words[before]) {
        Some((start, before)) if TRACKER_WORDS.contains(&before.to_ascii_lowercase().as_str()) => {
            line[start..at + word.len()].to_owned()
        }
        _ => format!("#{word}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_hashes_and_tracker_references_are_found() {
        let text = "Fixed in e7e09aa.\n\
                    As measured (was 136 before 3bd524b8513308a119d7a3bd524b8513308a1100).\n\
                    See issue 46, issues #12 and PR 7; also #46.\n";
        let found = problems(text);
        assert_eq!(
            found,
            [
                "1: `e7e09aa` looks like a commit hash",
                "2: `3bd524b8513308a119d7a3bd524b8513308a1100` looks like a commit hash",
                "3: `issue 46` looks like a tracker reference",
                "3: `issues #12` looks like a tracker reference",
                "3: `PR 7` looks like a tracker reference",
                "3: `#46` looks like a tracker reference",
            ]
        );
    }

    #[test]
    fn digests_words_numbers_and_headings_pass() {
        let text = "# Title\n\
                    ## 2. Second\n\
                    `sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1d2a6c04b7a2ea4e1c6e4f0f8a` is a digest.\n\
                    e2e tests, h2c, 10000 keys, 1234567 bytes, deadbeefcafe, p99 of 12.5 ms, 0x1f2e3d4c.\n\
                    &#123; is an entity; key `wc_4f9a2b7c` is a prefix; [scale](performance.md#100000-keys).\n\
                    traceparent 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01, request 4bf92f35….\n";
        assert_eq!(problems(text), Vec::<String>::new());
    }
}
