//! Chart versions: a chart repository's `index.yaml`, OCI tags, and which version an exact
//! version or a semver range (Helm's syntax) selects. Pure: the agent uses it when it renders,
//! the hub when it polls (`pollingInterval`, decision 0104-hub-polls-chart-versions).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

/// One version of a chart in a repository's `index.yaml`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct ChartEntry {
    /// The chart version.
    #[serde(default)]
    pub version: String,
    /// Where the archive is (absolute, or relative to the repository URL).
    #[serde(default)]
    pub urls: Vec<String>,
    /// sha256 of the archive, hex.
    #[serde(default)]
    pub digest: Option<String>,
}

#[derive(Deserialize)]
struct Index {
    #[serde(default)]
    entries: BTreeMap<String, Vec<ChartEntry>>,
}

/// The versions of every chart in an `index.yaml`; `Err` when the text is not an index.
pub fn parse_index(text: &str) -> Result<BTreeMap<String, Vec<ChartEntry>>, String> {
    serde_saphyr::from_str::<Index>(text)
        .map(|i| i.entries)
        .map_err(|_| "not a chart repository index".to_string())
}

/// The entry of `versions` that `constraint` selects: an exact version, else the highest
/// version a semver range accepts (Helm's syntax: `^1.2`, `~1.2`, `>=1 <2`, `1.x`; empty:
/// the highest stable version).
pub fn select_version<'a>(
    versions: &'a [ChartEntry],
    constraint: Option<&str>,
) -> Result<&'a ChartEntry, String> {
    let constraint = constraint.map(str::trim).filter(|c| !c.is_empty());
    if let Some(c) = constraint
        && let Some(exact) = versions
            .iter()
            .find(|e| e.version == c || e.version.strip_prefix('v') == Some(c))
    {
        return Ok(exact);
    }
    let req = match constraint {
        None => semver::VersionReq::STAR,
        Some(c) => semver::VersionReq::parse(&helm_range(c))
            .map_err(|e| format!("version {c:?} is neither a version nor a range: {e}"))?,
    };
    versions
        .iter()
        .filter_map(|e| {
            let v = semver::Version::parse(e.version.trim_start_matches('v')).ok()?;
            req.matches(&v).then_some((v, e))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, e)| e)
        .ok_or_else(|| match constraint {
            Some(c) => format!("no version matches {c:?}"),
            None => "no stable version".to_string(),
        })
}

/// Helm (Masterminds) range syntax → the `semver` crate's: comparators separated by spaces
/// become comma-separated.
fn helm_range(c: &str) -> String {
    let mut parts: Vec<String> = Vec::new();
    for tok in c.split_whitespace() {
        let tok = tok.trim_end_matches(',');
        // `>= 1.0` (operator alone) joins the next token.
        if let Some(last) = parts.last_mut()
            && last.chars().all(|ch| "<>=~^!".contains(ch))
        {
            last.push_str(tok);
            continue;
        }
        parts.push(tok.to_string());
    }
    parts.join(", ")
}

/// The tag of a chart version: OCI tags cannot hold `+`, so Helm stores it as `_`.
pub fn version_tag(version: &str) -> String {
    version.replace('+', "_")
}

/// The tag to pull for `constraint` among `tags`: an exact version's tag, else the highest
/// version a range accepts (tags that are no version are ignored; `_` reads as `+`).
pub fn select_tag(tags: &[String], constraint: Option<&str>) -> Result<String, String> {
    let entries: Vec<ChartEntry> = tags
        .iter()
        .map(|t| ChartEntry {
            version: t.replace('_', "+"),
            urls: vec![t.clone()],
            digest: None,
        })
        .collect();
    select_version(&entries, constraint).map(|e| e.urls[0].clone())
}

/// Whether `version` names one version (no range): never polled, fetched without listing.
pub fn is_exact(version: &str) -> bool {
    semver::Version::parse(version.trim().trim_start_matches('v')).is_ok()
}

/// Whether the range `constraint` (empty: any stable version) accepts `version`: a version
/// the hub resolved earlier still stands for the spec it was resolved for.
pub fn accepts(constraint: Option<&str>, version: &str) -> bool {
    let entry = [ChartEntry {
        version: version.to_string(),
        ..ChartEntry::default()
    }];
    select_version(&entry, constraint).is_ok()
}

/// Floor of `pollingInterval` (also the CRD's): a shorter interval is read as this one.
pub const MIN_POLLING_INTERVAL: Duration = Duration::from_secs(15);

/// A Go duration as Fleet writes `pollingInterval` (`30s`, `5m`, `1h30m`, `1.5h`); `None` when
/// it is not one (the CRD's pattern refuses those).
pub fn parse_duration(text: &str) -> Option<Duration> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..number_len].parse().ok()?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += number * scale;
    }
    (total.is_finite() && total < 1e9).then(|| Duration::from_secs_f64(total))
}

/// The interval a `pollingInterval` asks for, never below [`MIN_POLLING_INTERVAL`]; `None`
/// for `0` (any zero duration: no polling, as in Fleet) and for what is not a duration.
pub fn polling_interval(text: &str) -> Option<Duration> {
    parse_duration(text)
        .filter(|d| !d.is_zero())
        .map(|d| d.max(MIN_POLLING_INTERVAL))
}

/// The interval a `pollingInterval` asks for when the hub raises it to
/// [`MIN_POLLING_INTERVAL`] (above zero and below the floor); `None` otherwise.
pub fn raised_polling_interval(text: &str) -> Option<Duration> {
    parse_duration(text).filter(|d| !d.is_zero() && *d < MIN_POLLING_INTERVAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(versions: &[&str]) -> Vec<ChartEntry> {
        versions
            .iter()
            .map(|v| ChartEntry {
                version: v.to_string(),
                urls: vec![format!("app-{v}.tgz")],
                digest: None,
            })
            .collect()
    }

    #[test]
    fn exact_versions_and_ranges() {
        let e = entries(&["1.0.0", "1.2.0", "1.10.1", "2.0.0", "2.1.0-rc.1"]);
        let pick = |c: Option<&str>| select_version(&e, c).map(|e| e.version.as_str());
        assert_eq!(pick(Some("1.2.0")), Ok("1.2.0"));
        assert_eq!(pick(None), Ok("2.0.0"), "latest stable");
        assert_eq!(pick(Some("")), Ok("2.0.0"));
        assert_eq!(pick(Some("^1.0")), Ok("1.10.1"));
        assert_eq!(pick(Some("~1.2")), Ok("1.2.0"));
        assert_eq!(pick(Some(">=1.0.0 <1.5.0")), Ok("1.2.0"));
        assert_eq!(pick(Some(">= 1.0.0, < 2")), Ok("1.10.1"));
        assert_eq!(pick(Some("1.x")), Ok("1.10.1"));
        assert_eq!(
            pick(Some("2.1.0-rc.1")),
            Ok("2.1.0-rc.1"),
            "exact prerelease"
        );
        assert!(
            pick(Some("3.0.0"))
                .unwrap_err()
                .contains("no version matches")
        );
        assert!(pick(Some("not a range")).is_err());
    }

    #[test]
    fn tags_map_to_versions_with_underscore_for_plus() {
        let t: Vec<String> = ["0.1.0", "0.2.0_build.1", "latest"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(select_tag(&t, None), Ok("0.2.0_build.1".to_string()));
        assert_eq!(select_tag(&t, Some("~0.1")), Ok("0.1.0".to_string()));
        assert!(select_tag(&[], None).is_err());
        assert_eq!(version_tag("1.2.3+meta"), "1.2.3_meta");
        assert!(is_exact("1.2.3+meta") && is_exact("v1.2.3"));
        assert!(!is_exact("^1.2") && !is_exact("1.x") && !is_exact(">=1.0.0"));
    }

    #[test]
    fn a_resolved_version_stands_while_the_range_accepts_it() {
        assert!(accepts(Some("^0.1"), "0.1.5"));
        assert!(!accepts(Some("^0.2"), "0.1.5"), "the range moved on");
        assert!(accepts(None, "3.0.0"));
        assert!(!accepts(None, "3.0.0-rc.1"), "latest is a stable version");
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1.5m"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        for bad in ["", "5", "5d", "m", "1..2s"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
        assert_eq!(polling_interval("1s"), Some(MIN_POLLING_INTERVAL));
        assert_eq!(polling_interval("0"), None, "Fleet's 0: no polling");
        assert_eq!(polling_interval("0s"), None);
        assert_eq!(raised_polling_interval("5s"), Some(Duration::from_secs(5)));
        assert_eq!(raised_polling_interval("15s"), None);
        assert_eq!(raised_polling_interval("0"), None);
        assert_eq!(polling_interval("1.5µs"), Some(MIN_POLLING_INTERVAL));
        assert_eq!(polling_interval("2m"), Some(Duration::from_secs(120)));
    }

    #[test]
    fn the_index_parses() {
        let text = "apiVersion: v1\nentries:\n  app:\n  - name: app\n    version: 0.1.0\n    \
            digest: abc\n    urls:\n    - app-0.1.0.tgz\ngenerated: \"2026-01-01T00:00:00Z\"\n";
        let index = parse_index(text).unwrap();
        assert_eq!(index["app"][0].urls, ["app-0.1.0.tgz"]);
        assert!(parse_index("- a list").is_err());
    }
}
