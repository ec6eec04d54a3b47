//! Bundle names as Fleet derives them (`names.HelmReleaseName` and `names.Limit` in Fleet's
//! `internal/names`): the path with `/` as `-`, lowercased, other characters replaced, a hash
//! appended when that lost information, and at most 53 characters (a Helm release name).

use md5::{Digest, Md5};

/// Fleet's `MaxHelmReleaseNameLen`.
pub const MAX_NAME_LEN: usize = 53;

/// The first `len` hex digits of the MD5 of `s` (Fleet's `names.Hex`).
fn hex(s: &str, len: usize) -> String {
    let digest = Md5::digest(s.as_bytes());
    let mut out: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    out.truncate(len);
    out
}

/// `s` cut to `count` characters with a 5-digit hash, as Fleet's `names.Limit`.
pub fn limit(s: &str, count: usize) -> String {
    if s.len() <= count {
        return s.to_string();
    }
    const HEX_LEN: usize = 5;
    if count <= HEX_LEN + 1 {
        return s[..count].to_string();
    }
    let keep = count - HEX_LEN - 1;
    let sep = if &s[keep - 1..keep] == "-" { "" } else { "-" };
    format!("{}{sep}{}", &s[..keep], hex(s, HEX_LEN))
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Fleet's `names.HelmReleaseName`: a DNS-label-safe name of at most 53 characters.
pub fn helm_release_name(input: &str) -> String {
    let mut s = input.replace('/', "-");
    let disallowed = |c: char| !(c.is_ascii_alphanumeric() || c == '-');
    if s != s.to_lowercase() || s.chars().any(disallowed) {
        let h = hex(&s, 8);
        s = format!("{s}-{h}");
    }
    let mut cleaned = String::with_capacity(s.len());
    let mut in_run = false;
    for c in s.to_lowercase().chars() {
        if disallowed(c) || c == '-' {
            if !in_run {
                cleaned.push('-');
            }
            in_run = true;
        } else {
            cleaned.push(c);
            in_run = false;
        }
    }
    let cleaned = cleaned.trim_matches('-');
    if is_dns_label(cleaned) {
        limit(cleaned, MAX_NAME_LEN)
    } else {
        hex(input, 24)
    }
}

/// Go's `filepath.Join(name, dir)` for the two parts of a bundle ID (both may be empty or `.`).
pub fn bundle_id(prefix: &str, dir: &str) -> String {
    let parts: Vec<&str> = prefix
        .split('/')
        .chain(dir.split('/'))
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    parts.join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_fleets() {
        // Fleet's own test cases (internal/names/name_test.go) and its fleet-examples outputs.
        assert_eq!(
            helm_release_name("fleet-examples/multi-cluster/helm"),
            "fleet-examples-multi-cluster-helm"
        );
        assert_eq!(helm_release_name("a/b/c"), "a-b-c");
        assert_eq!(
            helm_release_name("Test/Bundle"),
            format!("test-bundle-{}", hex("Test-Bundle", 8))
        );
        let long = "a".repeat(60);
        let short = helm_release_name(&long);
        assert_eq!(short.len(), MAX_NAME_LEN);
        assert_eq!(short, format!("{}-{}", "a".repeat(47), hex(&long, 5)));
        assert_eq!(limit("abc", 10), "abc");
        // internal/names/name_test.go
        let str53 = "12345678901234567890123456789012345678901234567890123";
        assert_eq!(helm_release_name(str53), str53);
        assert_eq!(
            helm_release_name(&format!("{str53}a")),
            "12345678901234567890123456789012345678901234567-fdba4"
        );
        for (arg, result) in [
            (
                "long-name-test-shortpath-with@char",
                "long-name-test-shortpath-with-char-031bab5e",
            ),
            ("long-name-test-0.App_ ", "long-name-test-0-app-5bf6b3fb"),
            (
                "long-name-test--App_-_12.factor",
                "long-name-test-app-12-factor-0efbac37",
            ),
            (
                "bundle.name.example.com",
                "bundle-name-example-com-645ef821",
            ),
        ] {
            assert_eq!(helm_release_name(arg), result, "{arg}");
        }
        for (arg, n, result) in [
            ("1234567", 5, "12345"),
            ("12345678", 7, "1-25d55"),
            ("123456789", 8, "12-25f9e"),
            ("1-3456789", 8, "1-9b657"),
        ] {
            assert_eq!(limit(arg, n), result, "{arg}");
        }
        assert_eq!(bundle_id("", "./multi-cluster/helm"), "multi-cluster/helm");
        assert_eq!(bundle_id("repo", "."), "repo");
    }

    #[test]
    fn md5_prefix_is_go_s() {
        // md5("") = d41d8cd98f00b204e9800998ecf8427e
        assert_eq!(hex("", 8), "d41d8cd9");
    }
}
