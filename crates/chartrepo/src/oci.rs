//! OCI registries over the distribution API, as far as hub and agent share it: the
//! `oci://` reference, the answer to a registry's `WWW-Authenticate` challenge (`Basic` with
//! the credentials, or a `Bearer` token bought with them), bounded GETs of one registry, and
//! its tag list. Credentials and tokens live only in memory for one session.

use http::{StatusCode, header};
use serde::Deserialize;
use tender_types::conditions::reason;

use crate::{Budget, Failure, Http, Redirects, Reply, basic_auth, origin, without_userinfo};

/// Pages of `tags/list` followed before giving up.
const MAX_TAG_PAGES: usize = 50;

/// An `oci://host[:port]/path/name` chart reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OciRef {
    /// `host[:port]`.
    pub host: String,
    /// The repository inside the registry (`path/name`).
    pub repository: String,
}

/// Parses an `oci://` chart reference (the CRD's CEL rule already checks its shape).
pub fn parse_reference(chart: &str) -> Result<OciRef, String> {
    let rest = chart
        .strip_prefix("oci://")
        .ok_or_else(|| format!("{chart} is not an oci:// reference"))?;
    let (host, repository) = rest
        .split_once('/')
        .filter(|(h, r)| !h.is_empty() && !r.is_empty() && !r.contains(':') && !r.contains('@'))
        .ok_or_else(|| {
            format!("{chart} is not oci://<host>/<path>/<name> (set the version in helm.version)")
        })?;
    Ok(OciRef {
        host: host.to_string(),
        repository: repository.trim_end_matches('/').to_string(),
    })
}

/// A `WWW-Authenticate` challenge the agent can answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Challenge {
    /// Send the credentials as basic auth.
    Basic,
    /// Get a token from `realm` (with the credentials as basic auth) and send it as a bearer.
    Bearer {
        /// The token endpoint.
        realm: String,
        /// `service` query parameter.
        service: Option<String>,
        /// `scope` query parameter.
        scope: Option<String>,
    },
}

/// Parses a `WWW-Authenticate` header: `Basic realm="…"` or
/// `Bearer realm="…",service="…",scope="…"` (quoted values may hold commas).
pub fn parse_challenge(value: &str) -> Option<Challenge> {
    let value = value.trim();
    let (scheme, params) = value.split_once(char::is_whitespace).unwrap_or((value, ""));
    if scheme.eq_ignore_ascii_case("basic") {
        return Some(Challenge::Basic);
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let (mut realm, mut service, mut scope) = (None, None, None);
    let mut rest = params.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let after = after.trim_start();
        let (val, next) = if let Some(quoted) = after.strip_prefix('"') {
            let end = quoted.find('"')?;
            (&quoted[..end], &quoted[end + 1..])
        } else {
            after.split_once(',').map_or((after, ""), |(v, n)| (v, n))
        };
        match key.trim().to_ascii_lowercase().as_str() {
            "realm" => realm = Some(val.to_string()),
            "service" => service = Some(val.to_string()),
            "scope" => scope = Some(val.to_string()),
            _ => {}
        }
        rest = next.trim_start().trim_start_matches(',').trim_start();
    }
    Some(Challenge::Bearer {
        realm: realm.filter(|r| !r.is_empty())?,
        service,
        scope,
    })
}

/// The token endpoint's URL for a bearer challenge.
fn token_url(realm: &str, service: Option<&str>, scope: Option<&str>) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    if let Some(s) = service {
        query.append_pair("service", s);
    }
    if let Some(s) = scope {
        query.append_pair("scope", s);
    }
    let query = query.finish();
    match (query.is_empty(), realm.contains('?')) {
        (true, _) => realm.to_string(),
        (false, true) => format!("{realm}&{query}"),
        (false, false) => format!("{realm}?{query}"),
    }
}

/// One session with a registry: its base URL, the credentials, and the authorization that
/// worked.
pub struct Session<'a> {
    http: &'a Http,
    base: String,
    reference: &'a str,
    creds: Option<&'a (String, String)>,
    /// Credentials may go to a plain-HTTP token realm only when the registry is plain HTTP too.
    basic_http: bool,
    authorization: Option<String>,
    /// Tag lists, manifests and token responses (`--max-manifest-bytes`).
    manifest_budget: Budget,
}

impl<'a> Session<'a> {
    /// A session with the registry of `oci` (`reference`, for messages): plain HTTP with
    /// `basic_http`; tag lists, manifests and token answers within `manifest_budget`.
    pub fn new(
        http: &'a Http,
        oci: &OciRef,
        reference: &'a str,
        creds: Option<&'a (String, String)>,
        basic_http: bool,
        manifest_budget: Budget,
    ) -> Self {
        let scheme = if basic_http { "http" } else { "https" };
        Self {
            http,
            base: format!("{scheme}://{}", oci.host),
            reference,
            creds,
            basic_http,
            authorization: None,
            manifest_budget,
        }
    }

    /// `scheme://host[:port]` of the registry.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The budget of tag lists, manifests and token answers.
    pub fn manifest_budget(&self) -> Budget {
        self.manifest_budget
    }

    /// GET `url` of the registry, answering one authentication challenge.
    pub async fn get(
        &mut self,
        url: &str,
        accept: Option<&str>,
        budget: Budget,
        redirects: Redirects,
    ) -> Result<Reply, Failure> {
        let mut reply = self.send(url, accept, budget, redirects).await?;
        if reply.status == StatusCode::UNAUTHORIZED
            && let Some(challenge) = reply
                .headers
                .get(header::WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .and_then(parse_challenge)
        {
            let answer = self.answer(challenge).await?;
            if answer.is_some() && answer != self.authorization {
                self.authorization = answer;
                reply = self.send(url, accept, budget, redirects).await?;
            }
        }
        self.refused(&reply, "the registry")?;
        Ok(reply)
    }

    /// One GET of `url` with the session's authorization (sent to the registry only).
    async fn send(
        &self,
        url: &str,
        accept: Option<&str>,
        budget: Budget,
        redirects: Redirects,
    ) -> Result<Reply, Failure> {
        let authorization = self.authorization.as_deref();
        self.http
            .send(
                url,
                origin(&self.base),
                authorization,
                accept,
                budget,
                redirects,
            )
            .await
    }

    /// A 401 or 403 of `who` as an authentication failure.
    fn refused(&self, reply: &Reply, who: &str) -> Result<(), Failure> {
        if matches!(
            reply.status,
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
        ) {
            return Err(Failure::new(
                reason::CHART_AUTH_FAILED,
                format!(
                    "{}: {who} answered {}{}",
                    self.reference,
                    reply.status,
                    self.http.auth_hint(self.creds.is_some())
                ),
            ));
        }
        Ok(())
    }

    /// The `Authorization` value answering `challenge`; `None` when there is nothing to send.
    async fn answer(&self, challenge: Challenge) -> Result<Option<String>, Failure> {
        let basic = self.creds.map(|(u, p)| basic_auth(u, p));
        let (realm, service, scope) = match challenge {
            Challenge::Basic => return Ok(basic),
            Challenge::Bearer {
                realm,
                service,
                scope,
            } => (realm, service, scope),
        };
        let clear_ok = self.basic_http && realm.starts_with("http://");
        if !(realm.starts_with("https://") || clear_ok) {
            return Err(Failure::new(
                reason::CHART_AUTH_FAILED,
                format!(
                    "{}: the registry's token realm {realm} is not https (credentials are not sent in clear)",
                    self.reference
                ),
            ));
        }
        let url = token_url(&realm, service.as_deref(), scope.as_deref());
        let reply = self
            .http
            .send(
                &url,
                origin(&realm),
                basic.as_deref(),
                None,
                self.manifest_budget,
                Redirects::Listed,
            )
            .await?;
        let realm_shown = without_userinfo(&realm);
        self.refused(&reply, &format!("the token service {realm_shown}"))?;
        if !reply.status.is_success() {
            return Err(Failure::new(
                reason::CHART_REPOSITORY_UNREACHABLE,
                format!(
                    "{}: the token service {realm_shown} answered {}",
                    self.reference, reply.status
                ),
            ));
        }
        #[derive(Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let token = serde_json::from_slice::<Token>(&reply.body)
            .ok()
            .and_then(|t| t.token.or(t.access_token))
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                Failure::new(
                    reason::CHART_AUTH_FAILED,
                    format!(
                        "{}: the token service {realm_shown} returned no token",
                        self.reference
                    ),
                )
            })?;
        Ok(Some(format!("Bearer {token}")))
    }

    /// Every tag of the repository (following `Link` pagination).
    pub async fn tags(&mut self, repository: &str) -> Result<Vec<String>, Failure> {
        #[derive(Deserialize)]
        struct Tags {
            #[serde(default)]
            tags: Option<Vec<String>>,
        }
        let mut url = format!("{}/v2/{repository}/tags/list", self.base);
        let mut out = Vec::new();
        let mut used = 0u64;
        for _ in 0..MAX_TAG_PAGES {
            let budget = Budget {
                used,
                what: "tag list",
                ..self.manifest_budget
            };
            let reply = self.get(&url, None, budget, Redirects::Listed).await?;
            used = used.saturating_add(reply.body.len() as u64);
            if reply.status == StatusCode::NOT_FOUND {
                return Err(Failure::new(
                    reason::CHART_VERSION_NOT_FOUND,
                    format!("{}: no such chart in the registry (404)", self.reference),
                ));
            }
            unexpected(&reply, self.reference)?;
            let page: Tags = serde_json::from_slice(&reply.body).map_err(|_| {
                Failure::new(
                    reason::CHART_REPOSITORY_UNREACHABLE,
                    format!("{}: the tag list is not JSON", self.reference),
                )
            })?;
            out.extend(page.tags.unwrap_or_default());
            match next_link(&reply) {
                Some(next) => url = format!("{}{next}", self.base),
                None => return Ok(out),
            }
        }
        Ok(out)
    }
}

/// The path of a `Link: <…>; rel="next"` header.
fn next_link(reply: &Reply) -> Option<String> {
    let link = reply.headers.get(header::LINK)?.to_str().ok()?;
    let (target, params) = link.split_once(';')?;
    params.contains("rel=\"next\"").then(|| {
        let target = target.trim().trim_start_matches('<').trim_end_matches('>');
        // Relative per the spec; an absolute URL keeps only its path.
        target
            .split_once("://")
            .map_or(target, |(_, r)| r.find('/').map_or("", |i| &r[i..]))
            .to_string()
    })
}

/// Any non-success status not handled by the caller: the registry is unusable.
pub fn unexpected(reply: &Reply, reference: &str) -> Result<(), Failure> {
    if reply.status.is_success() {
        Ok(())
    } else {
        Err(Failure::new(
            reason::CHART_REPOSITORY_UNREACHABLE,
            format!(
                "{reference}: GET {} answered {}",
                without_userinfo(&reply.url),
                reply.status
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_into_host_and_repository() {
        assert_eq!(
            parse_reference("oci://127.0.0.1:5000/charts/app"),
            Ok(OciRef {
                host: "127.0.0.1:5000".into(),
                repository: "charts/app".into()
            })
        );
        assert_eq!(
            parse_reference("oci://ghcr.io/app").unwrap().repository,
            "app"
        );
        assert!(
            parse_reference("oci://ghcr.io/app:1.0").is_err(),
            "tag in the reference"
        );
        assert!(parse_reference("oci://ghcr.io").is_err());
        assert!(parse_reference("https://ghcr.io/app").is_err());
    }

    #[test]
    fn challenges_parse() {
        assert_eq!(
            parse_challenge("Basic realm=\"registry\""),
            Some(Challenge::Basic)
        );
        assert_eq!(
            parse_challenge(
                "Bearer realm=\"https://auth.example/token\",service=\"registry.example\",scope=\"repository:charts/app:pull,push\""
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.example/token".into(),
                service: Some("registry.example".into()),
                scope: Some("repository:charts/app:pull,push".into()),
            })
        );
        assert_eq!(
            parse_challenge("bearer realm=https://a/t, service=s"),
            Some(Challenge::Bearer {
                realm: "https://a/t".into(),
                service: Some("s".into()),
                scope: None
            })
        );
        assert_eq!(parse_challenge("Bearer service=\"s\""), None, "no realm");
        assert_eq!(parse_challenge("Negotiate abc"), None);
        assert_eq!(
            token_url("https://a/t", Some("reg"), Some("repository:c/app:pull")),
            "https://a/t?service=reg&scope=repository%3Ac%2Fapp%3Apull"
        );
        assert_eq!(
            token_url("https://a/t?x=1", Some("r"), None),
            "https://a/t?x=1&service=r"
        );
    }

    #[test]
    fn tag_pages_follow_the_next_link() {
        let reply = |link: Option<&str>| {
            let mut headers = http::HeaderMap::new();
            if let Some(l) = link {
                headers.insert(header::LINK, l.parse().unwrap());
            }
            Reply {
                status: StatusCode::OK,
                headers,
                body: bytes::Bytes::new(),
                url: String::new(),
            }
        };
        assert_eq!(
            next_link(&reply(Some(
                "</v2/c/app/tags/list?last=0.2.0&n=100>; rel=\"next\""
            ))),
            Some("/v2/c/app/tags/list?last=0.2.0&n=100".into())
        );
        assert_eq!(
            next_link(&reply(Some(
                "<https://r.example/v2/c/app/tags/list?last=b>; rel=\"next\""
            ))),
            Some("/v2/c/app/tags/list?last=b".into()),
            "an absolute link keeps its path: credentials stay with the registry"
        );
        assert_eq!(next_link(&reply(Some("</x>; rel=\"prev\""))), None);
        assert_eq!(next_link(&reply(None)), None);
    }
}
