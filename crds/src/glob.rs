//! Model name patterns: `*` matches any run of characters.

/// Whether `name` matches `pattern`, where `*` matches any run of characters
/// (including none) and everything else matches itself.
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    let pattern = pattern.as_bytes();
    let name = name.as_bytes();
    let (mut p, mut n) = (0, 0);
    // Position of the last `*` seen and the name position it was tried at:
    // backtracking to it is enough, since `*` runs are greedy-agnostic.
    let mut last_star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            last_star = Some((p, n));
            p += 1;
        } else if p < pattern.len() && pattern[p] == name[n] {
            p += 1;
            n += 1;
        } else if let Some((star, tried)) = last_star {
            p = star + 1;
            n = tried + 1;
            last_star = Some((star, tried + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&b| b == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_matching() {
        let cases = [
            ("llama-*", "llama-3.1-8b", true),
            ("llama-*", "llama-", true),
            ("llama-*", "mistral", false),
            ("*", "anything", true),
            ("*", "", true),
            ("gpt-4o", "gpt-4o", true),
            ("gpt-4o", "gpt-4o-mini", false),
            ("*-mini", "gpt-4o-mini", true),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "aXXbYY", false),
            ("*a*a*a*", "aaa", true),
            ("*a*a*a*", "aa", false),
        ];
        for (pattern, name, expected) in cases {
            assert_eq!(glob_matches(pattern, name), expected, "{pattern} vs {name}");
        }
    }
}
