//! Charts from HTTP(S) chart repositories: `index.yaml`, version selection (exact or semver
//! range), download with basic auth into the chart cache; every response bounded in size and
//! redirects kept on the repository's origin (decision 0076-bounded-chart-sources), through
//! the client the hub shares (decision 0117-one-chart-repository-client).

use std::path::PathBuf;

use sha2::{Digest, Sha256};
use tender_chartrepo::{Budget, Http, Side, absolute, index_url, without_userinfo};
use tender_types::HelmOptions;
pub use tender_types::chart_version::{ChartEntry, select_version};
use tender_types::conditions::reason;

use super::ChartFailure;
use super::cache::Cache;
use crate::config::ChartLimits;

/// Who the shared client works for: the agent's `User-Agent` and the hints of its messages.
pub(crate) const AGENT: Side = Side {
    user_agent: concat!("tender-agent/", env!("CARGO_PKG_VERSION")),
    redirect_hint: " (agent flag --chart-redirect-hosts allows an https host)",
    without_credentials_hint: " (set helm.helmSecretName to a copied Secret with username/password)",
};

/// The chart archive `helm` selects, from the cache or downloaded into it.
pub(crate) async fn fetch_chart(
    http: &Http,
    cache: &Cache,
    helm: &HelmOptions,
    auth: Option<&(String, String)>,
    limits: &ChartLimits,
) -> Result<PathBuf, ChartFailure> {
    let repo = helm.repo.as_deref().unwrap_or_default();
    let budget = Budget::new(
        limits.max_index_bytes,
        "repository index",
        "agent flag --max-index-bytes",
    );
    let versions = http.chart_entries(repo, &helm.chart, auth, budget).await?;
    let entry = select_version(&versions, helm.version.as_deref()).map_err(|m| {
        ChartFailure::new(
            reason::CHART_VERSION_NOT_FOUND,
            format!("chart {:?} in {}: {m}", helm.chart, without_userinfo(repo)),
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
                "chart {:?} {} has no download URL in {}",
                helm.chart,
                entry.version,
                without_userinfo(&index_url(repo))
            ),
        )
    })?;
    let budget = Budget::new(
        limits.max_chart_bytes,
        "chart archive",
        "agent flag --max-chart-bytes",
    );
    let archive = http.get(&absolute(repo, url), repo, auth, budget).await?;
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

/// The archive at the absolute URL `helm.chart` (repo unset), through the same client, bound,
/// TLS trust, credentials (sent to the URL's origin only) and redirect rules as a repository's
/// chart. There is no index and so no digest to check: the archive is stored under its own
/// sha256. `helm.version`, if set, must be the archive's Chart.yaml version.
pub(crate) async fn fetch_url(
    http: &Http,
    cache: &Cache,
    helm: &HelmOptions,
    auth: Option<&(String, String)>,
    limits: &ChartLimits,
) -> Result<PathBuf, ChartFailure> {
    let budget = Budget::new(
        limits.max_chart_bytes,
        "chart archive",
        "agent flag --max-chart-bytes",
    );
    let url = &helm.chart;
    let archive = http.get(url, url, auth, budget).await?;
    if let Some(want) = helm.version.as_deref().filter(|v| !v.trim().is_empty()) {
        let found = crate::files::archive_version(&archive);
        if found.as_deref() != Some(want.trim()) {
            return Err(ChartFailure::new(
                reason::CHART_VERSION_NOT_FOUND,
                format!(
                    "chart {}: helm.version is {want:?} but the archive's Chart.yaml says {}",
                    without_userinfo(url),
                    found.map_or_else(|| "no version".to_string(), |v| format!("{v:?}"))
                ),
            ));
        }
    }
    cache.store(&hex::encode(Sha256::digest(&archive)), &archive)
}
