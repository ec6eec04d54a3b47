//! Chart versions that move (`pollingInterval`, decision 0104-hub-polls-chart-versions): the
//! hub reads a chart repository's `index.yaml` (or an OCI registry's tag list), resolves
//! `helm.version` with the agent's rule ([`tender_types::chart_version`]) and hands the exact
//! version to every BundleDeployment, so all clusters render the same one.
//!
//! Bounded: one look per interval per (namespace, repository, chart, credentials) whatever
//! the number of Bundles and reconciles, [`POLL_TIMEOUT`] for the whole look, at most
//! [`MAX_INDEX_BYTES`] read, redirects only on the repository's origin, credentials sent only
//! to it and never logged or quoted. A failed look keeps the version resolved before.

use std::time::Duration;

use tender_chartrepo::without_userinfo;
use tender_types::chart_version::{self, ChartEntry};
use tender_types::conditions::reason;
use tender_types::{BundleSpec, HelmOptions};

mod client;

pub use client::Poller;

/// Upper bound of one look (every request and redirect of it).
pub const POLL_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes of an `index.yaml` (or of one tag-list page) read at most, as the agent's default
/// `--max-index-bytes`.
pub const MAX_INDEX_BYTES: usize = 32 * 1024 * 1024;

/// Why a look failed: a stable reason and a message with no credentials in it (the shared
/// chart-repository client's failure).
pub use tender_chartrepo::Failure;

/// Username and password for the repository (from the Secret `helmSecretName` names).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Credentials {
    /// `username`.
    pub username: String,
    /// `password`.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credentials(redacted)")
    }
}

/// What a Bundle's status says about its last look, and the version it deploys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PollReport {
    /// The exact version every BundleDeployment gets (`status.version`); `None` until one was
    /// resolved (the agents then resolve the range themselves, as without polling).
    pub version: Option<String>,
    /// `Polled` status.
    pub ok: bool,
    /// `Polled` reason.
    pub reason: &'static str,
    /// `Polled` message.
    pub message: String,
}

/// The interval and chart of a Bundle that polls: `pollingInterval` set, a `helm` chart, and a
/// version that is a range or empty (an exact version is never polled). An absolute chart URL
/// and a chart carried in `resources` have no index to look in: never polled.
pub fn polling(spec: &BundleSpec) -> Option<(Duration, &HelmOptions)> {
    let helm = spec
        .helm
        .as_ref()
        .filter(|h| !h.is_url() && h.files_dir().is_none())?;
    let interval = chart_version::polling_interval(spec.polling_interval.as_deref()?)?;
    let exact = helm.version.as_deref().is_some_and(chart_version::is_exact);
    (!exact).then_some((interval, helm))
}

/// How the hub resolves a Bundle's chart version range.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Resolution<'a> {
    /// Every interval: `pollingInterval` ([`polling`]).
    Every(Duration, &'a HelmOptions),
    /// Once per spec: a HelmOp's Bundle without polling (no `pollingInterval`, or `0`) whose
    /// version is a range or empty. Fleet's HelmOp controller resolves such a version on the
    /// hub whenever the HelmOp changes (`handleVersion`), so every cluster gets the same one.
    Once(&'a HelmOptions),
}

/// How the hub resolves `bundle`'s chart version, if it does: on its interval, or once per
/// spec for a HelmOp's Bundle (Fleet's rule); `None` for a Bundle of its own without
/// `pollingInterval` (its agents resolve a range when they render, as Fleet's agents do).
pub fn resolution(bundle: &tender_types::Bundle) -> Option<Resolution<'_>> {
    if let Some((interval, helm)) = polling(&bundle.spec) {
        return Some(Resolution::Every(interval, helm));
    }
    let helm = bundle.spec.helm.as_ref()?;
    let a_helmops = bundle
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(tender_types::labels::HELMOP));
    let exact = helm.version.as_deref().is_some_and(chart_version::is_exact);
    (a_helmops && !exact).then_some(Resolution::Once(helm))
}

/// Where the chart is looked up, for messages: the repository URL without user info (or the
/// `oci://` reference) and the chart.
pub fn source(helm: &HelmOptions) -> String {
    if helm.is_oci() {
        return helm.chart.clone();
    }
    let repo = helm.repo.as_deref().unwrap_or_default();
    format!("{} in {}", helm.chart, without_userinfo(repo))
}

/// The report for `helm` given the versions a look found (or why it failed) and the version
/// the Bundle's status `recorded`: a match → that version; no match or a failure → `Polled`
/// False with the reason, and the recorded version kept while the range still accepts it.
/// Pure.
pub fn report(
    helm: &HelmOptions,
    found: &Result<Vec<String>, Failure>,
    recorded: Option<&str>,
) -> PollReport {
    let constraint = helm.version.as_deref().filter(|v| !v.trim().is_empty());
    let wanted = constraint.map_or_else(
        || "the latest stable version".to_string(),
        |c| format!("version {c:?}"),
    );
    let kept = recorded
        .filter(|v| chart_version::accepts(constraint, v))
        .map(str::to_string);
    let keeping = |kept: &Option<String>| match kept {
        Some(v) => format!("; {v} stays deployed"),
        None => String::new(),
    };
    let failed = |reason, message: String| PollReport {
        message: format!("{message}{}", keeping(&kept)),
        version: kept.clone(),
        ok: false,
        reason,
    };
    match found {
        Err(f) => failed(f.reason, f.message.clone()),
        Ok(versions) => {
            let entries: Vec<ChartEntry> = versions
                .iter()
                .map(|v| ChartEntry {
                    version: v.clone(),
                    ..ChartEntry::default()
                })
                .collect();
            match chart_version::select_version(&entries, constraint) {
                Ok(e) => PollReport {
                    version: Some(e.version.trim_start_matches('v').to_string()),
                    ok: true,
                    reason: reason::VERSION_RESOLVED,
                    message: format!("{wanted} of {} is {}", source(helm), e.version),
                },
                Err(m) => failed(
                    reason::CHART_VERSION_NOT_FOUND,
                    format!("chart {}: {m}", source(helm)),
                ),
            }
        }
    }
}

/// Writes `report` into a Bundle's status: `version` and the `Polled` condition, whose
/// `lastTransitionTime` moves whenever the version or the outcome changes ("when"); without a
/// report (no polling) both are removed. An unchanged report changes nothing (no write).
pub fn set_status(
    status: &mut tender_types::BundleStatus,
    report: Option<&PollReport>,
    generation: Option<i64>,
    now: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) {
    use tender_types::conditions::{TYPE_POLLED, set_condition};
    let Some(r) = report else {
        status.version = None;
        status.conditions.retain(|c| c.type_ != TYPE_POLLED);
        return;
    };
    let moved = status.version != r.version;
    status.version.clone_from(&r.version);
    set_condition(
        &mut status.conditions,
        TYPE_POLLED,
        r.ok,
        r.reason,
        &r.message,
        generation,
        now.clone(),
    );
    if moved
        && let Some(c) = status
            .conditions
            .iter_mut()
            .find(|c| c.type_ == TYPE_POLLED)
    {
        c.last_transition_time = now;
    }
}

/// Writes the `PollingInterval` condition: `False`, reason PollingIntervalRaised, when the
/// Bundle polls and its `pollingInterval` is below the hub's floor (`asked`); removed
/// otherwise. Pure.
pub fn set_raised(
    status: &mut tender_types::BundleStatus,
    asked: Option<(&str, Duration)>,
    generation: Option<i64>,
    now: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) {
    use tender_types::conditions::{TYPE_POLLING_INTERVAL, set_condition};
    let Some((text, _)) = asked else {
        status
            .conditions
            .retain(|c| c.type_ != TYPE_POLLING_INTERVAL);
        return;
    };
    let floor = chart_version::MIN_POLLING_INTERVAL.as_secs();
    let message = format!(
        "pollingInterval {text} is below the hub's floor of {floor}s: the hub looks every {floor}s"
    );
    set_condition(
        &mut status.conditions,
        TYPE_POLLING_INTERVAL,
        false,
        reason::POLLING_INTERVAL_RAISED,
        &message,
        generation,
        now,
    );
}

/// The `pollingInterval` text and what it asks for, when the Bundle polls and the hub raises
/// it to its floor.
pub fn raised(spec: &BundleSpec) -> Option<(&str, Duration)> {
    polling(spec)?;
    let text = spec.polling_interval.as_deref()?;
    chart_version::raised_polling_interval(text).map(|d| (text, d))
}

/// The delay before the next look: the interval plus up to a tenth of it, so Bundles polling
/// the same repository drift apart.
pub fn jittered(interval: Duration) -> Duration {
    let mut b = [0u8; 2];
    let _ = getrandom::fill(&mut b);
    let tenth = interval / 10;
    interval + tenth.mul_f64(f64::from(u16::from_le_bytes(b)) / f64::from(u16::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn helm(version: Option<&str>) -> HelmOptions {
        serde_json::from_value(json!({
            "chart": "app", "repo": "https://user:pw@charts.example.com/stable", "version": version
        }))
        .unwrap()
    }

    fn versions(v: &[&str]) -> Result<Vec<String>, Failure> {
        Ok(v.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn only_ranges_with_an_interval_poll() {
        let spec = |interval: Option<&str>, version: Option<&str>| BundleSpec {
            helm: Some(helm(version)),
            polling_interval: interval.map(str::to_string),
            ..BundleSpec::default()
        };
        assert_eq!(
            polling(&spec(Some("1m"), Some("^1"))).map(|p| p.0),
            Some(Duration::from_secs(60))
        );
        assert!(polling(&spec(Some("1m"), None)).is_some(), "latest");
        assert!(polling(&spec(Some("1m"), Some("1.2.3"))).is_none(), "exact");
        assert!(polling(&spec(None, Some("^1"))).is_none());
        assert_eq!(
            polling(&spec(Some("1s"), Some("^1"))).map(|p| p.0),
            Some(chart_version::MIN_POLLING_INTERVAL)
        );
        assert!(polling(&BundleSpec::default()).is_none());
    }

    #[test]
    fn absolute_urls_and_charts_in_resources_are_never_polled() {
        for chart in [
            json!({"chart": "https://charts.example.com/app-1.0.0.tgz"}),
            json!({"chart": "http://charts.example.com/app-1.0.0.tgz", "repo": ""}),
            json!({"chart": "./chart"}),
            json!({"chart": ""}),
        ] {
            let spec = BundleSpec {
                helm: Some(serde_json::from_value(chart.clone()).unwrap()),
                polling_interval: Some("1m".into()),
                ..BundleSpec::default()
            };
            assert!(polling(&spec).is_none(), "{chart}");
        }
    }

    #[test]
    fn a_look_resolves_the_range() {
        let r = report(
            &helm(Some("^0.1")),
            &versions(&["0.1.0", "0.1.4", "0.2.0"]),
            None,
        );
        assert_eq!(r.version.as_deref(), Some("0.1.4"));
        assert!(r.ok);
        assert_eq!(r.reason, reason::VERSION_RESOLVED);
        assert_eq!(
            r.message,
            "version \"^0.1\" of app in https://charts.example.com/stable is 0.1.4"
        );
        assert!(!r.message.contains("pw"), "no user info");
        let latest = report(&helm(None), &versions(&["0.1.0", "1.0.0-rc.1"]), None);
        assert_eq!(latest.version.as_deref(), Some("0.1.0"));
    }

    #[test]
    fn a_failed_look_keeps_what_was_resolved() {
        let down = Err(Failure::new(
            reason::CHART_REPOSITORY_UNREACHABLE,
            "GET x: refused",
        ));
        let r = report(&helm(Some("^0.1")), &down, Some("0.1.4"));
        assert_eq!(r.version.as_deref(), Some("0.1.4"));
        assert!(!r.ok);
        assert_eq!(r.reason, reason::CHART_REPOSITORY_UNREACHABLE);
        assert_eq!(r.message, "GET x: refused; 0.1.4 stays deployed");
        // A recorded version the range no longer accepts is not kept.
        let r = report(&helm(Some("^0.2")), &down, Some("0.1.4"));
        assert_eq!(r.version, None);
        let none = report(&helm(Some("^3")), &versions(&["0.1.0"]), Some("0.1.0"));
        assert_eq!(none.reason, reason::CHART_VERSION_NOT_FOUND);
        assert_eq!(none.version, None);
    }

    #[test]
    fn the_status_moves_only_with_the_version() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        use k8s_openapi::jiff::Timestamp;
        use tender_types::conditions::{TYPE_POLLED, find_condition};
        let at = |s| Time(Timestamp::from_second(s).unwrap());
        let mut status = tender_types::BundleStatus::default();
        let first = report(&helm(Some("^0.1")), &versions(&["0.1.0"]), None);
        set_status(&mut status, Some(&first), Some(1), at(10));
        assert_eq!(status.version.as_deref(), Some("0.1.0"));
        let before = status.clone();
        set_status(&mut status, Some(&first), Some(1), at(20));
        assert_eq!(status, before, "nothing new: nothing changes");
        let next = report(&helm(Some("^0.1")), &versions(&["0.1.0", "0.1.1"]), None);
        set_status(&mut status, Some(&next), Some(1), at(30));
        let c = find_condition(&status.conditions, TYPE_POLLED).unwrap();
        assert_eq!(c.last_transition_time, at(30), "when the version moved");
        set_status(&mut status, None, Some(2), at(40));
        assert!(status.version.is_none() && status.conditions.is_empty());
    }

    #[test]
    fn jitter_stays_within_a_tenth() {
        let i = Duration::from_secs(100);
        for _ in 0..20 {
            let j = jittered(i);
            assert!(j >= i && j <= Duration::from_secs(110), "{j:?}");
        }
    }

    #[test]
    fn urls_lose_their_user_info() {
        assert_eq!(without_userinfo("https://u:p@h:1/x"), "https://h:1/x");
        assert_eq!(without_userinfo("http://h/x@y"), "http://h/x@y");
        assert_eq!(
            format!(
                "{:?}",
                Some(Credentials {
                    username: "u".into(),
                    password: "p".into()
                })
            ),
            "Some(Credentials(redacted))"
        );
    }
}
