//! One bounded GET: rustls over HTTP/1, redirects followed only where allowed, the
//! `Authorization` header only to the origin it is for, at most a budget of bytes read.

use bytes::Bytes;
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tender_types::conditions::reason;

use crate::{Failure, absolute, basic_auth, origin, without_userinfo};

/// Redirects followed before giving up.
const MAX_REDIRECTS: usize = 5;

/// Who uses the client: what it sends as `User-Agent`, and the hints its messages give (a
/// flag of the agent's, a setting of the Bundle's).
#[derive(Clone, Copy, Debug)]
pub struct Side {
    /// `User-Agent` of every request.
    pub user_agent: &'static str,
    /// Appended to a refused redirect's message.
    pub redirect_hint: &'static str,
    /// Appended to a 401/403 when no credentials were sent.
    pub without_credentials_hint: &'static str,
}

/// How much of one response may be read, and what it is (for the message).
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    /// The limit, in bytes.
    pub limit: u64,
    /// Bytes of the limit already spent (earlier pages of one tag list).
    pub used: u64,
    /// What the response is ("chart archive").
    pub what: &'static str,
    /// What sets the limit, for the message ("agent flag --max-chart-bytes").
    pub setting: &'static str,
}

impl Budget {
    /// A budget of `limit` bytes for a `what`, set by `setting`.
    pub fn new(limit: u64, what: &'static str, setting: &'static str) -> Self {
        Self {
            limit,
            used: 0,
            what,
            setting,
        }
    }

    /// Bytes left to read.
    fn left(&self) -> u64 {
        self.limit.saturating_sub(self.used)
    }

    /// The failure of a response over the limit.
    pub fn exceeded(&self, url: &str) -> Failure {
        Failure::new(
            reason::CHART_TOO_LARGE,
            format!(
                "GET {}: the {} is larger than {} bytes ({})",
                without_userinfo(url),
                self.what,
                self.limit,
                self.setting
            ),
        )
    }
}

/// Where redirects of one request may go besides the origin it was sent to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Redirects {
    /// Only the client's listed hosts (`https://`).
    Listed,
    /// Any `https://` origin: an OCI blob, verified by its digest, which registries serve from
    /// their storage hosts (decision 0076-bounded-chart-sources).
    AnyHttps,
}

/// Whether a redirect from origin `from` to `to` (a URL) is followed.
pub fn redirect_allowed(from: &str, to: &str, policy: Redirects, hosts: &[String]) -> bool {
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

/// A response: status, headers, the whole body, and the URL that answered (after redirects).
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: http::HeaderMap,
    /// The body, within the budget.
    pub body: Bytes,
    /// The URL that answered.
    pub url: String,
}

/// The HTTP client for chart repositories (rustls, HTTP/1), cheap to clone.
#[derive(Clone)]
pub struct Http {
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>,
    /// Hosts a redirect may leave the origin for (the agent's `--chart-redirect-hosts`).
    redirect_hosts: Vec<String>,
    side: Side,
}

impl Http {
    /// A client with `tls` (see [`crate::Trust::client_config`]) for `side`.
    pub fn new(side: Side, redirect_hosts: Vec<String>, tls: rustls::ClientConfig) -> Self {
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        Self {
            client: Client::builder(TokioExecutor::new()).build(https),
            redirect_hosts,
            side,
        }
    }

    /// What to do about a 401/403, by whether credentials were sent.
    pub fn auth_hint(&self, with_credentials: bool) -> &'static str {
        if with_credentials {
            " (check the credentials in helmSecretName)"
        } else {
            self.side.without_credentials_hint
        }
    }

    /// GET `url`, following redirects that stay on its origin (or that `redirects` allows);
    /// `authorization` is sent only while the URL's origin is `auth_origin`; at most `budget`
    /// bytes of the body are read. Any status is returned: the caller decides what it means.
    pub async fn send(
        &self,
        url: &str,
        auth_origin: &str,
        authorization: Option<&str>,
        accept: Option<&str>,
        budget: Budget,
        redirects: Redirects,
    ) -> Result<Reply, Failure> {
        let start = origin(url).to_string();
        let mut url = url.to_string();
        for _ in 0..=MAX_REDIRECTS {
            let shown = without_userinfo(&url);
            let mut req = Request::get(&url).header(header::USER_AGENT, self.side.user_agent);
            if let Some(value) = authorization.filter(|_| origin(&url) == auth_origin) {
                req = req.header(header::AUTHORIZATION, value);
            }
            if let Some(accept) = accept {
                req = req.header(header::ACCEPT, accept);
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
                    format!("GET {shown}: {}", connect_error(&e)),
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
                    return Err(Failure::new(
                        reason::CHART_REDIRECT_REFUSED,
                        format!(
                            "GET {shown}: redirected from {} to another origin, {}; redirects \
                             must stay on the repository's origin{}",
                            without_userinfo(&start),
                            without_userinfo(origin(&next)),
                            self.side.redirect_hint
                        ),
                    ));
                }
                url = next;
                continue;
            }
            return read(resp, url, budget).await;
        }
        Err(Failure::new(
            reason::CHART_REPOSITORY_UNREACHABLE,
            format!(
                "GET {}: more than {MAX_REDIRECTS} redirects",
                without_userinfo(&url)
            ),
        ))
    }

    /// GET `url` of an HTTP chart repository `repo` with basic auth `auth` (sent only to the
    /// repository's origin): the body of a success, a failure for any other status.
    pub async fn get(
        &self,
        url: &str,
        repo: &str,
        auth: Option<&(String, String)>,
        budget: Budget,
    ) -> Result<Bytes, Failure> {
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
        let shown = without_userinfo(&reply.url);
        match reply.status {
            s if s.is_success() => Ok(reply.body),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Err(Failure::new(
                reason::CHART_AUTH_FAILED,
                format!(
                    "GET {shown}: {}{}",
                    reply.status,
                    self.auth_hint(auth.is_some())
                ),
            )),
            s => Err(Failure::new(
                reason::CHART_REPOSITORY_UNREACHABLE,
                format!("GET {shown}: {s}"),
            )),
        }
    }
}

/// The body of `resp` (which answered `url`) within `budget`.
async fn read(
    resp: http::Response<hyper::body::Incoming>,
    url: String,
    budget: Budget,
) -> Result<Reply, Failure> {
    let declared = resp
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > budget.left()) {
        return Err(budget.exceeded(&url));
    }
    let status = resp.status();
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
                Failure::new(
                    reason::CHART_REPOSITORY_UNREACHABLE,
                    format!("GET {}: reading the body: {e}", without_userinfo(&url)),
                )
            }
        })?;
    Ok(Reply {
        status,
        headers,
        body,
        url,
    })
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
    use crate::{absolute, origin};

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
