//! Charts from HTTP(S) chart repositories: `index.yaml`, version selection (exact or semver
//! range), download with basic auth into the chart cache; every response bounded in size and
//! redirects kept on the repository's origin (decision 0076-bounded-chart-sources).

use std::path::PathBuf;

use base64::Engine;
use bytes::Bytes;
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sha2::{Digest, Sha256};
use tender_types::HelmOptions;
pub use tender_types::chart_version::{ChartEntry, select_version};
use tender_types::conditions::reason;

use super::ChartFailure;
use super::cache::Cache;
use crate::config::ChartLimits;

/// Redirects followed before giving up.
const MAX_REDIRECTS: usize = 5;
/// Sent with every request, so a registry's log names the agent.
const USER_AGENT: &str = concat!("tender-agent/", env!("CARGO_PKG_VERSION"));

/// Resolves a chart URL from the index against the repository URL.
fn absolute(repo: &str, url: &str) -> String {
    if url.contains("://") {
        url.to_string()
    } else {
        format!(
            "{}/{}",
            repo.trim_end_matches('/'),
            url.trim_start_matches('/')
        )
    }
}

/// `scheme://host[:port]` of `url`.
pub(crate) fn origin(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let host_len = rest.find('/').unwrap_or(rest.len());
    &url[..url.len() - rest.len() + host_len]
}

/// How much of one response may be read, and what it is (for the message).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Budget {
    /// The limit, in bytes.
    pub(crate) limit: u64,
    /// Bytes of the limit already spent (earlier pages of one tag list).
    pub(crate) used: u64,
    /// What the response is ("chart archive").
    pub(crate) what: &'static str,
    /// The agent flag that sets the limit.
    pub(crate) flag: &'static str,
}

impl Budget {
    pub(crate) fn new(limit: u64, what: &'static str, flag: &'static str) -> Self {
        Self {
            limit,
            used: 0,
            what,
            flag,
        }
    }

    /// Bytes left to read.
    fn left(&self) -> u64 {
        self.limit.saturating_sub(self.used)
    }

    /// The failure of a response over the limit.
    pub(crate) fn exceeded(&self, url: &str) -> ChartFailure {
        ChartFailure::new(
            reason::CHART_TOO_LARGE,
            format!(
                "GET {url}: the {} is larger than {} bytes (agent flag {})",
                self.what, self.limit, self.flag
            ),
        )
    }
}

/// Where redirects of one request may go besides the origin it was sent to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Redirects {
    /// Only the hosts of `--chart-redirect-hosts` (`https://`).
    Listed,
    /// Any `https://` origin: an OCI blob, verified by its digest, which registries serve from
    /// their storage hosts (decision 0076-bounded-chart-sources).
    AnyHttps,
}

/// Whether a redirect from origin `from` to `to` (a URL) is followed.
pub(crate) fn redirect_allowed(from: &str, to: &str, policy: Redirects, hosts: &[String]) -> bool {
    let target = origin(to);
    if target.eq_ignore_ascii_case(from) {
        return true;
    }
    if !to.to_ascii_lowercase().starts_with("https://") {
        return false;
    }
    policy == Redirects::AnyHttps || hosts.iter().any(|h| h.eq_ignore_ascii_case(host(target)))
}

/// The host of an origin `scheme://host[:port]` (an IPv6 literal keeps its brackets).
fn host(origin: &str) -> &str {
    let rest = origin.split_once("://").map_or(origin, |(_, r)| r);
    match rest.strip_prefix('[') {
        Some(v6) => v6.find(']').map_or(rest, |i| &rest[..i + 2]),
        None => rest.split(':').next().unwrap_or(rest),
    }
}

/// The HTTP client for chart repositories (rustls, HTTP/1): with the system's roots, or one
/// deployment's trust (decision 0106-chart-repository-tls).
#[derive(Clone)]
pub(crate) struct Http {
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>,
    /// Hosts a redirect may leave the origin for (`--chart-redirect-hosts`).
    redirect_hosts: Vec<String>,
}

impl Http {
    pub(crate) fn new(redirect_hosts: Vec<String>, tls: rustls::ClientConfig) -> Self {
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        Self {
            client: Client::builder(TokioExecutor::new()).build(https),
            redirect_hosts,
        }
    }

    /// GET `url`, following redirects that stay on its origin (or that `redirects` allows);
    /// `authorization` is sent only while the URL's origin is `auth_origin`; at most `budget`
    /// bytes of the body are read. Any status is returned: the caller decides what it means.
    pub(crate) async fn send(
        &self,
        url: &str,
        auth_origin: &str,
        authorization: Option<&str>,
        accept: Option<&str>,
        budget: Budget,
        redirects: Redirects,
    ) -> Result<Reply, ChartFailure> {
        let start = origin(url).to_string();
        let mut url = url.to_string();
        for _ in 0..=MAX_REDIRECTS {
            let mut req = Request::get(&url).header(header::USER_AGENT, USER_AGENT);
            if let Some(value) = authorization.filter(|_| origin(&url) == auth_origin) {
                req = req.header(header::AUTHORIZATION, value);
            }
            if let Some(accept) = accept {
                req = req.header(header::ACCEPT, accept);
            }
            let req = req.body(Empty::new()).map_err(|e| {
                ChartFailure::new(
                    reason::CHART_REPOSITORY_UNREACHABLE,
                    format!("invalid URL {url}: {e}"),
                )
            })?;
            let resp = self.client.request(req).await.map_err(|e| {
                ChartFailure::new(
                    reason::CHART_REPOSITORY_UNREACHABLE,
                    format!("GET {url}: {}", connect_error(&e)),
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
                    absolute(&url, loc)
                };
                if !redirect_allowed(&start, &next, redirects, &self.redirect_hosts) {
                    return Err(ChartFailure::new(
                        reason::CHART_REDIRECT_REFUSED,
                        format!(
                            "GET {url}: redirected from {start} to another origin, {}; redirects \
                             must stay on the repository's origin (agent flag \
                             --chart-redirect-hosts allows an https host)",
                            origin(&next)
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
                .and_then(|v| v.parse::<u64>().ok());
            if declared.is_some_and(|n| n > budget.left()) {
                return Err(budget.exceeded(&url));
            }
            let headers = resp.headers().clone();
            let limit = usize::try_from(budget.left()).unwrap_or(usize::MAX);
            let body = Limited::new(resp.into_body(), limit)
                .collect()
                .await
                .map(|b| b.to_bytes())
                .map_err(|e| {
                    if e.downcast_ref::<http_body_util::LengthLimitError>()
                        .is_some()
                    {
                        budget.exceeded(&url)
                    } else {
                        ChartFailure::new(
                            reason::CHART_REPOSITORY_UNREACHABLE,
                            format!("GET {url}: reading the body: {e}"),
                        )
                    }
                })?;
            return Ok(Reply {
                status,
                headers,
                body,
                url,
            });
        }
        Err(ChartFailure::new(
            reason::CHART_REPOSITORY_UNREACHABLE,
            format!("GET {url}: more than {MAX_REDIRECTS} redirects"),
        ))
    }

    /// GET `url` of an HTTP chart repository; credentials are sent only to its own origin.
    async fn get(
        &self,
        url: &str,
        repo: &str,
        auth: Option<&(String, String)>,
        budget: Budget,
    ) -> Result<Bytes, ChartFailure> {
        let basic = auth.map(|(user, pass)| basic_auth(user, pass));
        let reply = self
            .send(
                url,
                origin(repo),
                basic.as_deref(),
                None,
                budget,
                Redirects::Listed,
            )
            .await?;
        match reply.status {
            s if s.is_success() => Ok(reply.body),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Err(ChartFailure::new(
                reason::CHART_AUTH_FAILED,
                format!(
                    "GET {}: {}{}",
                    reply.url,
                    reply.status,
                    auth_hint(auth.is_some())
                ),
            )),
            s => Err(ChartFailure::new(
                reason::CHART_REPOSITORY_UNREACHABLE,
                format!("GET {}: {s}", reply.url),
            )),
        }
    }

    /// The chart archive `helm` selects, from the cache or downloaded into it.
    pub(crate) async fn fetch_chart(
        &self,
        cache: &Cache,
        helm: &HelmOptions,
        auth: Option<&(String, String)>,
        limits: &ChartLimits,
    ) -> Result<PathBuf, ChartFailure> {
        let repo = helm.repo.as_deref().unwrap_or_default();
        let index_url = absolute(repo, "index.yaml");
        let budget = Budget::new(
            limits.max_index_bytes,
            "repository index",
            "--max-index-bytes",
        );
        let body = self.get(&index_url, repo, auth, budget).await?;
        let text = String::from_utf8_lossy(&body);
        let index = tender_types::chart_version::parse_index(&text).map_err(|_| {
            ChartFailure::new(
                reason::CHART_REPOSITORY_UNREACHABLE,
                format!("{index_url} is not a chart repository index"),
            )
        })?;
        let versions = index.get(&helm.chart).ok_or_else(|| {
            ChartFailure::new(
                reason::CHART_VERSION_NOT_FOUND,
                format!("chart {:?} is not in {index_url}", helm.chart),
            )
        })?;
        let entry = select_version(versions, helm.version.as_deref()).map_err(|m| {
            ChartFailure::new(
                reason::CHART_VERSION_NOT_FOUND,
                format!("chart {:?} in {repo}: {m}", helm.chart),
            )
        })?;
        let digest = entry
            .digest
            .as_deref()
            .filter(|d| d.len() == 64 && d.chars().all(|c| c.is_ascii_hexdigit()))
            .map(str::to_ascii_lowercase);
        if let Some(path) = digest.as_deref().and_then(|d| cache.get(d)) {
            return Ok(path);
        }
        let url = entry.urls.first().ok_or_else(|| {
            ChartFailure::new(
                reason::CHART_VERSION_NOT_FOUND,
                format!(
                    "chart {:?} {} has no download URL in {index_url}",
                    helm.chart, entry.version
                ),
            )
        })?;
        let budget = Budget::new(limits.max_chart_bytes, "chart archive", "--max-chart-bytes");
        let archive = self.get(&absolute(repo, url), repo, auth, budget).await?;
        let actual = hex::encode(Sha256::digest(&archive));
        if let Some(d) = &digest
            && *d != actual
        {
            return Err(ChartFailure::new(
                reason::CHART_DIGEST_MISMATCH,
                format!(
                    "chart {:?} {}: the archive's sha256 does not match the index digest",
                    helm.chart, entry.version
                ),
            ));
        }
        cache.store(&actual, &archive)
    }
}

/// A response: status, headers, the whole body, and the URL that answered (after redirects).
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) headers: http::HeaderMap,
    pub(crate) body: Bytes,
    pub(crate) url: String,
}

/// `Basic base64(user:pass)`.
pub(crate) fn basic_auth(user: &str, pass: &str) -> String {
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
    format!("Basic {token}")
}

/// What to do about a 401/403, by whether credentials were sent.
pub(crate) fn auth_hint(with_credentials: bool) -> &'static str {
    if with_credentials {
        " (check the credentials in helmSecretName)"
    } else {
        " (set helm.helmSecretName to a copied Secret with username/password)"
    }
}

/// A connect error's cause, without the request (which may carry the auth header).
fn connect_error(e: &hyper_util::client::legacy::Error) -> String {
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

    #[test]
    fn urls_resolve_against_the_repository() {
        assert_eq!(
            absolute("http://r/charts/", "a.tgz"),
            "http://r/charts/a.tgz"
        );
        assert_eq!(
            absolute("http://r/charts", "http://cdn/a.tgz"),
            "http://cdn/a.tgz"
        );
        assert_eq!(
            origin("https://r.example:8443/x/y"),
            "https://r.example:8443"
        );
        assert_eq!(origin("http://r"), "http://r");
    }

    #[test]
    fn redirects_stay_on_the_origin_unless_listed_or_an_https_blob() {
        let listed = vec!["release-assets.githubusercontent.com".to_string()];
        let ok = |from: &str, to: &str, p: Redirects| redirect_allowed(from, to, p, &listed);
        let r = "http://127.0.0.1:8080";
        assert!(ok(
            r,
            "http://127.0.0.1:8080/moved/a.tgz",
            Redirects::Listed
        ));
        assert!(
            !ok(r, "http://127.0.0.1:8081/a.tgz", Redirects::Listed),
            "port"
        );
        assert!(
            !ok(r, "https://127.0.0.1:8080/a.tgz", Redirects::Listed),
            "scheme"
        );
        assert!(
            !ok(r, "http://10.0.0.1:8080/a.tgz", Redirects::Listed),
            "host"
        );
        let gh = "https://github.com";
        assert!(ok(
            gh,
            "https://release-assets.githubusercontent.com/x?sig=1",
            Redirects::Listed
        ));
        assert!(
            !ok(
                gh,
                "http://release-assets.githubusercontent.com/x",
                Redirects::Listed
            ),
            "a listed host over plain http"
        );
        assert!(!ok(gh, "https://evil.example/x", Redirects::Listed));
        assert!(ok(gh, "https://evil.example/blob", Redirects::AnyHttps));
        assert!(!ok(gh, "http://169.254.169.254/", Redirects::AnyHttps));
        assert_eq!(host("https://[::1]:5000"), "[::1]");
        assert_eq!(host("https://r.example:443"), "r.example");
    }
}
