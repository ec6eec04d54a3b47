//! The hub's looks at chart repositories for `pollingInterval`: one HTTP(S) client (rustls,
//! the system's roots), `index.yaml` or an OCI tag list per (namespace, repository, chart,
//! credentials) at most once per interval, within [`super::POLL_TIMEOUT`] and
//! [`super::MAX_INDEX_BYTES`], redirects only on the repository's origin.

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
use tender_types::chart_version;
use tender_types::conditions::reason;

use tender_types::HelmOptions;

use super::{
    Credentials, Failure, MAX_INDEX_BYTES, MAX_REDIRECTS, MAX_TAG_PAGES, POLL_TIMEOUT, USER_AGENT,
    source, without_userinfo,
};

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
