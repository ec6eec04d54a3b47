//! Charts from OCI registries (`oci://host/path/name`), pulled by the agent itself over the
//! distribution API: tags (for a range) → manifest → the chart layer's blob, checked against
//! its sha256 digest and cached by it next to the HTTP repositories' archives.
//!
//! Authentication answers the registry's challenge: `Basic` with the `helmSecretName`
//! credentials, or the `Bearer` token flow (GET the realm with those credentials as basic
//! auth, use the token). Credentials and tokens live only in memory for one fetch.

use std::path::PathBuf;

use base64::Engine;
use http::StatusCode;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tender_chartrepo::{Budget, Http, Redirects, Session, unexpected};
pub use tender_chartrepo::{Challenge, OciRef, parse_challenge, parse_reference};
use tender_types::HelmOptions;
pub use tender_types::chart_version::{is_exact, select_tag, version_tag};
use tender_types::conditions::reason;

use super::ChartFailure;
use super::cache::Cache;
use crate::config::ChartLimits;

/// The manifest media type Helm pushes.
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// The media type of the layer holding the chart archive.
const CHART_LAYER: &str = "application/vnd.cncf.helm.chart.content.v1.tar+gzip";

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

/// The chart archive of the `oci://` chart `helm` names, from the cache or pulled into it.
pub(crate) async fn fetch_oci(
    http: &Http,
    cache: &Cache,
    helm: &HelmOptions,
    creds: Option<&(String, String)>,
    limits: &ChartLimits,
) -> Result<PathBuf, ChartFailure> {
    let oci = parse_reference(&helm.chart)
        .map_err(|m| ChartFailure::new(reason::CHART_REPOSITORY_UNREACHABLE, m))?;
    let mut session = Session::new(
        http,
        &oci,
        &helm.chart,
        creds,
        helm.basic_http,
        Budget::new(
            limits.max_manifest_bytes,
            "registry response",
            "agent flag --max-manifest-bytes",
        ),
    );
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
    let url = format!("{}/v2/{}/manifests/{tag}", session.base(), oci.repository);
    let budget = Budget {
        what: "manifest",
        ..session.manifest_budget()
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
        session.base(),
        oci.repository
    );
    // A blob is content-addressed and checked against its digest below; registries serve
    // blobs from storage hosts of their own, so a redirect may leave for any https origin.
    let budget = Budget::new(
        limits.max_chart_bytes,
        "chart layer",
        "agent flag --max-chart-bytes",
    );
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(t: &[&str]) -> Vec<String> {
        t.iter().map(|s| s.to_string()).collect()
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
