//! Charts from OCI registries (`oci://host/path/name`), pulled by the agent itself over the
//! distribution API: tags (for a range) → manifest → the chart layer's blob, checked against
//! its sha256 digest and cached by it next to the HTTP repositories' archives.
//!
//! Authentication answers the registry's challenge: `Basic` with the `helmSecretName`
//! credentials, or the `Bearer` token flow (GET the realm with those credentials as basic
//! auth, use the token). Credentials and tokens live only in memory for one fetch.

use std::path::PathBuf;

use base64::Engine;
use http::{StatusCode, header};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tender_types::HelmOptions;
pub use tender_types::chart_version::{is_exact, select_tag, version_tag};
use tender_types::conditions::reason;

use super::ChartFailure;
use super::cache::Cache;
use super::fetch::{Budget, Http, Redirects, Reply, auth_hint, basic_auth, origin};
use crate::config::ChartLimits;

/// The manifest media type Helm pushes.
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// The media type of the layer holding the chart archive.
const CHART_LAYER: &str = "application/vnd.cncf.helm.chart.content.v1.tar+gzip";
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

/// Username and password for `host` from a `.dockerconfigjson` (`auths` keyed by host, with
/// or without a scheme or path; `username`/`password` or `auth` = base64 `user:pass`).
pub fn docker_config_credentials(json: &[u8], host: &str) -> Option<(String, String)> {
    #[derive(Deserialize)]
    struct Config {
        #[serde(default)]
        auths: std::collections::BTreeMap<String, Entry>,
    }
    #[derive(Deserialize)]
    struct Entry {
        username: Option<String>,
        password: Option<String>,
        auth: Option<String>,
    }
    let config: Config = serde_json::from_slice(json).ok()?;
    let entry = config.auths.into_iter().find_map(|(key, entry)| {
        let key = key.split_once("://").map_or(key.as_str(), |(_, r)| r);
        let key = key.split('/').next().unwrap_or_default();
        key.eq_ignore_ascii_case(host).then_some(entry)
    })?;
    match (entry.username, entry.password, entry.auth) {
        (Some(u), Some(p), _) if !u.is_empty() => Some((u, p)),
        (_, _, Some(auth)) => {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(auth.trim())
                .ok()?;
            let (u, p) = std::str::from_utf8(&decoded).ok()?.split_once(':')?;
            Some((u.to_string(), p.to_string()))
        }
        _ => None,
    }
}

/// The chart layer's digest (`sha256` hex) in an OCI manifest.
pub fn chart_layer_digest(manifest: &[u8]) -> Result<String, String> {
    #[derive(Deserialize)]
    struct Manifest {
        #[serde(default)]
        layers: Vec<Layer>,
    }
    #[derive(Deserialize)]
    struct Layer {
        #[serde(rename = "mediaType", default)]
        media_type: String,
        #[serde(default)]
        digest: String,
    }
    let manifest: Manifest = serde_json::from_slice(manifest)
        .map_err(|_| "the manifest is not an OCI image manifest".to_string())?;
    let layer = manifest
        .layers
        .iter()
        .find(|l| l.media_type == CHART_LAYER)
        .ok_or_else(|| format!("the manifest has no {CHART_LAYER} layer: not a Helm chart"))?;
    layer
        .digest
        .strip_prefix("sha256:")
        .filter(|d| d.len() == 64 && d.chars().all(|c| c.is_ascii_hexdigit()))
        .map(str::to_ascii_lowercase)
        .ok_or_else(|| {
            format!(
                "the chart layer's digest {:?} is not a sha256 digest",
                layer.digest
            )
        })
}

/// One pull: the registry's base URL, the credentials, and the authorization that worked.
struct Session<'a> {
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

impl Session<'_> {
    /// GET `url` of the registry, answering one authentication challenge.
    async fn get(
        &mut self,
        url: &str,
        accept: Option<&str>,
        budget: Budget,
        redirects: Redirects,
    ) -> Result<Reply, ChartFailure> {
        let base = self.base.clone();
        let mut reply = self
            .http
            .send(
                url,
                origin(&base),
                self.authorization.as_deref(),
                accept,
                budget,
                redirects,
            )
            .await?;
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
                reply = self
                    .http
                    .send(
                        url,
                        origin(&base),
                        self.authorization.as_deref(),
                        accept,
                        budget,
                        redirects,
                    )
                    .await?;
            }
        }
        if matches!(
            reply.status,
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
        ) {
            return Err(ChartFailure::new(
                reason::CHART_AUTH_FAILED,
                format!(
                    "{}: the registry answered {}{}",
                    self.reference,
                    reply.status,
                    auth_hint(self.creds.is_some())
                ),
            ));
        }
        Ok(reply)
    }

    /// The `Authorization` value answering `challenge`; `None` when there is nothing to send.
    async fn answer(&self, challenge: Challenge) -> Result<Option<String>, ChartFailure> {
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
            return Err(ChartFailure::new(
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
        if matches!(
            reply.status,
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
        ) {
            return Err(ChartFailure::new(
                reason::CHART_AUTH_FAILED,
                format!(
                    "{}: the token service {realm} answered {}{}",
                    self.reference,
                    reply.status,
                    auth_hint(self.creds.is_some())
                ),
            ));
        }
        if !reply.status.is_success() {
            return Err(ChartFailure::new(
                reason::CHART_REPOSITORY_UNREACHABLE,
                format!(
                    "{}: the token service {realm} answered {}",
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
                ChartFailure::new(
                    reason::CHART_AUTH_FAILED,
                    format!(
                        "{}: the token service {realm} returned no token",
                        self.reference
                    ),
                )
            })?;
        Ok(Some(format!("Bearer {token}")))
    }

    /// Every tag of the repository (following `Link` pagination).
    async fn tags(&mut self, repository: &str) -> Result<Vec<String>, ChartFailure> {
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
                return Err(ChartFailure::new(
                    reason::CHART_VERSION_NOT_FOUND,
                    format!("{}: no such chart in the registry (404)", self.reference),
                ));
            }
            unexpected(&reply, self.reference)?;
            let page: Tags = serde_json::from_slice(&reply.body).map_err(|_| {
                ChartFailure::new(
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
fn unexpected(reply: &Reply, reference: &str) -> Result<(), ChartFailure> {
    if reply.status.is_success() {
        Ok(())
    } else {
        Err(ChartFailure::new(
            reason::CHART_REPOSITORY_UNREACHABLE,
            format!("{reference}: GET {} answered {}", reply.url, reply.status),
        ))
    }
}

impl Http {
    /// The chart archive of the `oci://` chart `helm` names, from the cache or pulled into it.
    pub(crate) async fn fetch_oci(
        &self,
        cache: &Cache,
        helm: &HelmOptions,
        creds: Option<&(String, String)>,
        limits: &ChartLimits,
    ) -> Result<PathBuf, ChartFailure> {
        let oci = parse_reference(&helm.chart)
            .map_err(|m| ChartFailure::new(reason::CHART_REPOSITORY_UNREACHABLE, m))?;
        let scheme = if helm.basic_http { "http" } else { "https" };
        let mut session = Session {
            http: self,
            base: format!("{scheme}://{}", oci.host),
            reference: &helm.chart,
            creds,
            basic_http: helm.basic_http,
            authorization: None,
            manifest_budget: Budget::new(
                limits.max_manifest_bytes,
                "registry response",
                "--max-manifest-bytes",
            ),
        };
        let version = helm
            .version
            .as_deref()
            .map(str::trim)
            .filter(|v| !v.is_empty());
        let tag = match version {
            Some(v) if is_exact(v) => version_tag(v),
            _ => {
                let tags = session.tags(&oci.repository).await?;
                select_tag(&tags, version).map_err(|m| {
                    ChartFailure::new(
                        reason::CHART_VERSION_NOT_FOUND,
                        format!("{}: {m}", helm.chart),
                    )
                })?
            }
        };
        let url = format!("{}/v2/{}/manifests/{tag}", session.base, oci.repository);
        let budget = Budget {
            what: "manifest",
            ..session.manifest_budget
        };
        let reply = session
            .get(&url, Some(MANIFEST), budget, Redirects::Listed)
            .await?;
        if reply.status == StatusCode::NOT_FOUND {
            return Err(ChartFailure::new(
                reason::CHART_VERSION_NOT_FOUND,
                format!("{}: no tag {tag} in the registry (404)", helm.chart),
            ));
        }
        unexpected(&reply, &helm.chart)?;
        let digest = chart_layer_digest(&reply.body).map_err(|m| {
            ChartFailure::new(
                reason::CHART_REPOSITORY_UNREACHABLE,
                format!("{}:{tag}: {m}", helm.chart),
            )
        })?;
        if let Some(path) = cache.get(&digest) {
            return Ok(path);
        }
        let url = format!(
            "{}/v2/{}/blobs/sha256:{digest}",
            session.base, oci.repository
        );
        // A blob is content-addressed and checked against its digest below; registries serve
        // blobs from storage hosts of their own, so a redirect may leave for any https origin.
        let budget = Budget::new(limits.max_chart_bytes, "chart layer", "--max-chart-bytes");
        let reply = session.get(&url, None, budget, Redirects::AnyHttps).await?;
        unexpected(&reply, &helm.chart)?;
        if hex::encode(Sha256::digest(&reply.body)) != digest {
            return Err(ChartFailure::new(
                reason::CHART_DIGEST_MISMATCH,
                format!(
                    "{}:{tag}: the chart layer's sha256 does not match its manifest digest",
                    helm.chart
                ),
            ));
        }
        cache.store(&digest, &reply.body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(t: &[&str]) -> Vec<String> {
        t.iter().map(|s| s.to_string()).collect()
    }

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
    fn tags_map_to_versions_with_underscore_for_plus() {
        let t = tags(&[
            "0.1.0",
            "0.2.0",
            "0.2.1_build.7",
            "1.0.0-rc.1",
            "latest",
            "sha256-abc.sig",
        ]);
        let pick = |c: Option<&str>| select_tag(&t, c);
        assert_eq!(
            pick(None),
            Ok("0.2.1_build.7".into()),
            "highest stable, non-version tags ignored"
        );
        assert_eq!(pick(Some("^0.1")), Ok("0.1.0".into()));
        assert_eq!(pick(Some(">=0.2.0 <1.0.0")), Ok("0.2.1_build.7".into()));
        assert_eq!(
            pick(Some("0.2.1+build.7")),
            Ok("0.2.1_build.7".into()),
            "exact, + read from _"
        );
        assert_eq!(
            pick(Some("1.0.0-rc.1")),
            Ok("1.0.0-rc.1".into()),
            "exact prerelease"
        );
        assert!(pick(Some("^2")).unwrap_err().contains("no version matches"));
        assert!(select_tag(&[], None).is_err());
        assert_eq!(version_tag("1.2.3+meta"), "1.2.3_meta");
        assert!(is_exact("1.2.3+meta") && is_exact("v1.2.3"));
        assert!(!is_exact("^1.2") && !is_exact("1.x") && !is_exact(">=1.0.0"));
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
    fn docker_config_matches_the_registry_host() {
        let auth = base64::engine::general_purpose::STANDARD.encode("bob:pw2");
        let json = format!(
            r#"{{"auths":{{"https://other.example/v1/":{{"username":"x","password":"y"}},
            "reg.example:5000":{{"username":"alice","password":"pw1"}},
            "https://ghcr.io":{{"auth":"{auth}"}}}}}}"#
        );
        let get = |h| docker_config_credentials(json.as_bytes(), h);
        assert_eq!(
            get("reg.example:5000"),
            Some(("alice".into(), "pw1".into()))
        );
        assert_eq!(get("ghcr.io"), Some(("bob".into(), "pw2".into())));
        assert_eq!(get("other.example"), Some(("x".into(), "y".into())));
        assert_eq!(get("reg.example"), None, "the port is part of the host");
        assert_eq!(docker_config_credentials(b"not json", "ghcr.io"), None);
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

    #[test]
    fn the_chart_layer_is_found_by_media_type() {
        let d = "a".repeat(64);
        let manifest = format!(
            r#"{{"schemaVersion":2,"config":{{"mediaType":"application/vnd.cncf.helm.config.v1+json","digest":"sha256:{}"}},
            "layers":[{{"mediaType":"application/vnd.cncf.helm.chart.provenance.v1.prov","digest":"sha256:{}"}},
            {{"mediaType":"{CHART_LAYER}","digest":"sha256:{d}"}}]}}"#,
            "b".repeat(64),
            "c".repeat(64)
        );
        assert_eq!(chart_layer_digest(manifest.as_bytes()), Ok(d));
        let image = r#"{"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:x"}]}"#;
        assert!(
            chart_layer_digest(image.as_bytes())
                .unwrap_err()
                .contains("not a Helm chart")
        );
        let bad =
            format!(r#"{{"layers":[{{"mediaType":"{CHART_LAYER}","digest":"sha512:abc"}}]}}"#);
        assert!(chart_layer_digest(bad.as_bytes()).is_err());
    }
}
