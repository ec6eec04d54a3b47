//! Chart versions that move (`pollingInterval`, decision 0104-hub-polls-chart-versions): the
//! hub reads a chart repository's `index.yaml` (or an OCI registry's tag list), resolves
//! `helm.version` with the agent's rule ([`tender_types::chart_version`]) and hands the exact
//! version to every BundleDeployment, so all clusters render the same one.
//!
//! Bounded: one look per interval per (namespace, repository, chart, credentials) whatever
//! the number of Bundles and reconciles, [`POLL_TIMEOUT`] for the whole look, at most
//! [`MAX_INDEX_BYTES`] read, redirects only on the repository's origin, credentials sent only
//! to it and never logged or quoted. A failed look keeps the version resolved before.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tender_types::chart_version::{self, ChartEntry};
use tender_types::conditions::reason;
use tender_types::{BundleSpec, HelmOptions};

/// Upper bound of one look (every request and redirect of it).
pub const POLL_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes of an `index.yaml` (or of one tag-list page) read at most, as the agent's default
/// `--max-index-bytes`.
pub const MAX_INDEX_BYTES: usize = 32 * 1024 * 1024;
/// Redirects followed (on the repository's origin only).
const MAX_REDIRECTS: usize = 5;
/// Pages of an OCI tag list followed.
const MAX_TAG_PAGES: usize = 50;
const USER_AGENT: &str = concat!("tender-hub/", env!("CARGO_PKG_VERSION"));

/// Why a look failed: a stable reason and a message with no credentials in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// A `tender_types::conditions::reason` word.
    pub reason: &'static str,
    /// What happened (URLs without user info, never a credential).
    pub message: String,
}

impl Failure {
    fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

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
/// version that is a range or empty (an exact version is never polled).
pub fn polling(spec: &BundleSpec) -> Option<(Duration, &HelmOptions)> {
    let helm = spec.helm.as_ref()?;
    let interval = chart_version::polling_interval(spec.polling_interval.as_deref()?)?;
    let exact = helm.version.as_deref().is_some_and(chart_version::is_exact);
    (!exact).then_some((interval, helm))
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

fn without_userinfo(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let host_end = rest.find('/').unwrap_or(rest.len());
            let authority = &rest[..host_end];
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            format!("{scheme}://{host}{}", &rest[host_end..])
        }
        None => url.to_string(),
    }
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

/// The delay before the next look: the interval plus up to a tenth of it, so Bundles polling
/// the same repository drift apart.
pub fn jittered(interval: Duration) -> Duration {
    let mut b = [0u8; 2];
    let _ = getrandom::fill(&mut b);
    let tenth = interval / 10;
    interval + tenth.mul_f64(f64::from(u16::from_le_bytes(b)) / f64::from(u16::MAX))
}

/// (namespace, repository or oci reference, chart, credentials): one look per interval each.
type Key = (String, String, String, Option<Credentials>);
/// When a look was made, and the versions it found (or why it failed).
type Look = (Instant, Result<Vec<String>, Failure>);

/// The hub's looks at chart repositories, shared by the Bundles of a scope.
pub struct Poller {
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>,
    found: Mutex<HashMap<Key, Look>>,
}

impl Default for Poller {
    fn default() -> Self {
        Self::new()
    }
}

impl Poller {
    /// A poller with rustls and the system's roots (as the agent's chart client).
    pub fn new() -> Self {
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(cert);
        }
        let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        Self {
            client: Client::builder(TokioExecutor::new()).build(https),
            found: Mutex::default(),
        }
    }

    /// The versions of `helm`'s chart: from a look younger than `interval`, else from a new
    /// look (at most [`POLL_TIMEOUT`]).
    pub async fn versions(
        &self,
        namespace: &str,
        helm: &HelmOptions,
        credentials: Option<Credentials>,
        interval: Duration,
    ) -> Result<Vec<String>, Failure> {
        let key: Key = (
            namespace.to_string(),
            helm.repo.clone().unwrap_or_default(),
            helm.chart.clone(),
            credentials.clone(),
        );
        if let Some((at, found)) = self.found.lock().expect("poll cache").get(&key)
            && at.elapsed() < interval
        {
            return found.clone();
        }
        let look = async {
            if helm.is_oci() {
                self.oci_tags(helm, credentials.as_ref()).await
            } else {
                self.index_versions(helm, credentials.as_ref()).await
            }
        };
        let found = match tokio::time::timeout(POLL_TIMEOUT, look).await {
            Ok(found) => found,
            Err(_) => Err(Failure::new(
                reason::CHART_REPOSITORY_UNREACHABLE,
                format!(
                    "{}: no answer within {}s",
                    source(helm),
                    POLL_TIMEOUT.as_secs()
                ),
            )),
        };
        let mut cache = self.found.lock().expect("poll cache");
        // Looks older than the longest sane interval are of Bundles gone or changed.
        cache.retain(|_, (at, _)| at.elapsed() < Duration::from_secs(24 * 3600));
        cache.insert(key, (Instant::now(), found.clone()));
        found
    }

    async fn index_versions(
        &self,
        helm: &HelmOptions,
        credentials: Option<&Credentials>,
    ) -> Result<Vec<String>, Failure> {
        let repo = helm.repo.as_deref().unwrap_or_default();
        let url = format!("{}/index.yaml", repo.trim_end_matches('/'));
        let auth = credentials.map(|c| basic(&c.username, &c.password));
        let (status, body, _) = self.send(&url, auth.as_deref(), false).await?;
        check(status, &url, credentials.is_some())?;
        let index = chart_version::parse_index(&String::from_utf8_lossy(&body)).map_err(|_| {
            Failure::new(
                reason::CHART_REPOSITORY_UNREACHABLE,
                format!("{} is not a chart repository index", without_userinfo(&url)),
            )
        })?;
        let entries = index.get(&helm.chart).ok_or_else(|| {
            Failure::new(
                reason::CHART_VERSION_NOT_FOUND,
                format!(
                    "chart {:?} is not in {}",
                    helm.chart,
                    without_userinfo(&url)
                ),
            )
        })?;
        Ok(entries.iter().map(|e| e.version.clone()).collect())
    }

    /// An OCI registry's tags of the chart's repository (Basic, or a Bearer token from the
    /// realm the registry names, with the credentials when there are some).
    async fn oci_tags(
        &self,
        helm: &HelmOptions,
        credentials: Option<&Credentials>,
    ) -> Result<Vec<String>, Failure> {
        let rest = helm.chart.trim_start_matches("oci://");
        let (host, repository) = rest.split_once('/').unwrap_or((rest, ""));
        let scheme = if helm.basic_http { "http" } else { "https" };
        let mut url = format!("{scheme}://{host}/v2/{repository}/tags/list");
        let mut auth: Option<String> = None;
        let mut tags = Vec::new();
        for _ in 0..MAX_TAG_PAGES {
            let (mut status, mut body, mut headers) =
                self.send(&url, auth.as_deref(), false).await?;
            if status == StatusCode::UNAUTHORIZED && auth.is_none() {
                let challenge = headers
                    .get(header::WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                auth = self
                    .answer(&challenge, repository, credentials, helm.basic_http)
                    .await?;
                if auth.is_some() {
                    (status, body, headers) = self.send(&url, auth.as_deref(), false).await?;
                }
            }
            check(status, &url, credentials.is_some())?;
            #[derive(serde::Deserialize)]
            struct Page {
                #[serde(default)]
                tags: Option<Vec<String>>,
            }
            let page: Page = serde_json::from_slice(&body).map_err(|_| {
                Failure::new(
                    reason::CHART_REPOSITORY_UNREACHABLE,
                    format!("{url} did not answer with a tag list"),
                )
            })?;
            tags.extend(page.tags.unwrap_or_default());
            let next = headers
                .get(header::LINK)
                .and_then(|v| v.to_str().ok())
                .and_then(|l| l.split_once('<').and_then(|(_, r)| r.split_once('>')))
                .map(|(path, _)| path.to_string());
            match next {
                Some(path) if path.starts_with('/') => url = format!("{scheme}://{host}{path}"),
                _ => return Ok(tags.into_iter().map(|t| t.replace('_', "+")).collect()),
            }
        }
        Ok(tags.into_iter().map(|t| t.replace('_', "+")).collect())
    }

    /// The `Authorization` answering a registry's `WWW-Authenticate` challenge, if any.
    async fn answer(
        &self,
        challenge: &str,
        repository: &str,
        credentials: Option<&Credentials>,
        basic_http: bool,
    ) -> Result<Option<String>, Failure> {
        let basic_auth = credentials.map(|c| basic(&c.username, &c.password));
        let lower = challenge.to_ascii_lowercase();
        if lower.starts_with("basic") {
            return Ok(basic_auth);
        }
        if !lower.starts_with("bearer") {
            return Ok(None);
        }
        let param = |name: &str| {
            let at = lower.find(&format!("{name}=\""))? + name.len() + 2;
            let end = challenge[at..].find('"')?;
            Some(challenge[at..at + end].to_string())
        };
        let Some(realm) = param("realm") else {
            return Ok(None);
        };
        // Credentials go to a plain-HTTP token realm only with basicHTTP, as the agent's.
        let basic_auth =
            basic_auth.filter(|_| basic_http || realm.to_ascii_lowercase().starts_with("https://"));
        let mut token_url = format!(
            "{realm}?scope={}",
            form_escape(&format!("repository:{repository}:pull"))
        );
        if let Some(service) = param("service") {
            token_url.push_str(&format!("&service={}", form_escape(&service)));
        }
        // The token endpoint may be another origin than the registry: the credentials go
        // there only because the registry named it, as Helm and the agent do.
        let (status, body, _) = self.send(&token_url, basic_auth.as_deref(), true).await?;
        check(status, &without_userinfo(&realm), credentials.is_some())?;
        let token: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        Ok(token["token"]
            .as_str()
            .or_else(|| token["access_token"].as_str())
            .map(|t| format!("Bearer {t}")))
    }

    /// GET `url`, following redirects that stay on its origin; `authorization` only to that
    /// origin (`any_origin`: a token endpoint, which sends no redirects we follow elsewhere).
    async fn send(
        &self,
        url: &str,
        authorization: Option<&str>,
        any_origin: bool,
    ) -> Result<(StatusCode, Bytes, http::HeaderMap), Failure> {
        let start = origin(url).to_string();
        let mut url = url.to_string();
        for _ in 0..=MAX_REDIRECTS {
            let shown = without_userinfo(&url);
            let mut req = Request::get(&url).header(header::USER_AGENT, USER_AGENT);
            if let Some(a) = authorization.filter(|_| any_origin || origin(&url) == start) {
                req = req.header(header::AUTHORIZATION, a);
            }
            let req = req.body(Empty::new()).map_err(|_| {
                Failure::new(
                    reason::CHART_REPOSITORY_UNREACHABLE,
                    format!("invalid URL {shown}"),
                )
            })?;
            let resp = self.client.request(req).await.map_err(|e| {
                Failure::new(
                    reason::CHART_REPOSITORY_UNREACHABLE,
                    format!("GET {shown}: {}", root_cause(&e)),
                )
            })?;
            let status = resp.status();
            if status.is_redirection()
                && let Some(loc) = resp
                    .headers()
                    .get(header::LOCATION)
                    .and_then(|l| l.to_str().ok())
            {
                let next = if loc.starts_with('/') {
                    format!("{}{loc}", origin(&url))
                } else {
                    loc.to_string()
                };
                if origin(&next) != start {
                    return Err(Failure::new(
                        reason::CHART_REDIRECT_REFUSED,
                        format!(
                            "GET {shown}: redirected to another origin; the hub follows \
                             redirects on the repository's origin only"
                        ),
                    ));
                }
                url = next;
                continue;
            }
            let declared = resp
                .headers()
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<usize>().ok());
            let too_large = || {
                Failure::new(
                    reason::CHART_TOO_LARGE,
                    format!("GET {shown}: the answer is larger than {MAX_INDEX_BYTES} bytes"),
                )
            };
            if declared.is_some_and(|n| n > MAX_INDEX_BYTES) {
                return Err(too_large());
            }
            let headers = resp.headers().clone();
            let body = Limited::new(resp.into_body(), MAX_INDEX_BYTES)
                .collect()
                .await
                .map(|b| b.to_bytes())
                .map_err(|e| {
                    if e.downcast_ref::<http_body_util::LengthLimitError>()
                        .is_some()
                    {
                        too_large()
                    } else {
                        Failure::new(
                            reason::CHART_REPOSITORY_UNREACHABLE,
                            format!("GET {shown}: reading the answer failed"),
                        )
                    }
                })?;
            return Ok((status, body, headers));
        }
        Err(Failure::new(
            reason::CHART_REPOSITORY_UNREACHABLE,
            format!(
                "GET {}: more than {MAX_REDIRECTS} redirects",
                without_userinfo(&url)
            ),
        ))
    }
}

/// A non-success status as a failure.
fn check(status: StatusCode, url: &str, with_credentials: bool) -> Result<(), Failure> {
    let shown = without_userinfo(url);
    match status {
        s if s.is_success() => Ok(()),
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Err(Failure::new(
            reason::CHART_AUTH_FAILED,
            if with_credentials {
                format!("GET {shown}: {status} (check the credentials in helmSecretName)")
            } else {
                format!(
                    "GET {shown}: {status} (set helmSecretName to a Secret with username and \
                     password, listed in downstreamResources)"
                )
            },
        )),
        s => Err(Failure::new(
            reason::CHART_REPOSITORY_UNREACHABLE,
            format!("GET {shown}: {s}"),
        )),
    }
}

fn basic(user: &str, pass: &str) -> String {
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
    format!("Basic {token}")
}

fn form_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `scheme://host[:port]` of `url`.
fn origin(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let host_len = rest.find('/').unwrap_or(rest.len());
    &url[..url.len() - rest.len() + host_len]
}

/// A connect error's cause, without the request (which may carry the auth header).
fn root_cause(e: &hyper_util::client::legacy::Error) -> String {
    let mut source: Option<&dyn std::error::Error> = std::error::Error::source(e);
    let mut last = e.to_string();
    while let Some(s) = source {
        last = s.to_string();
        source = s.source();
    }
    last
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
