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

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::files::{File, chart_archive};

    /// A loopback server answering every GET with `answer(path)` (head and body); the request
    /// heads it saw are kept.
    async fn serve(
        answer: impl Fn(&str) -> Vec<u8> + Send + Sync + 'static,
    ) -> (String, Arc<Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (answer, kept) = (Arc::new(answer), seen.clone());
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let (answer, kept) = (answer.clone(), kept.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        let Ok(n) = conn.read(&mut buf).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        head.extend_from_slice(&buf[..n]);
                    }
                    let head = String::from_utf8_lossy(&head).into_owned();
                    let path = head.split(' ').nth(1).unwrap_or_default().to_string();
                    kept.lock().unwrap().push(head);
                    let _ = conn.write_all(&answer(&path)).await;
                });
            }
        });
        (url, seen)
    }

    fn ok(body: &[u8]) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        out.extend_from_slice(body);
        out
    }

    fn archive(version: &str) -> Vec<u8> {
        let files = [File {
            name: "Chart.yaml".into(),
            bytes: format!("apiVersion: v2\nname: app\nversion: {version}\n").into_bytes(),
        }];
        chart_archive(&files, "").unwrap()
    }

    fn helm(chart: String, version: Option<&str>) -> HelmOptions {
        HelmOptions {
            chart,
            version: version.map(str::to_string),
            ..Default::default()
        }
    }

    fn cache(tag: &str) -> Cache {
        let dir =
            std::env::temp_dir().join(format!("tender-fetch-url-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Cache::new(dir, 1 << 30)
    }

    fn http() -> Http {
        Http::new(
            AGENT,
            Vec::new(),
            tender_chartrepo::Trust::default().client_config(&tender_chartrepo::system_roots()),
        )
    }

    #[tokio::test]
    async fn an_absolute_url_is_fetched_with_its_credentials_and_its_version_checked() {
        let tgz = archive("1.2.3");
        let served = tgz.clone();
        let (url, seen) = serve(move |_| ok(&served)).await;
        let chart = format!("{url}/charts/app-1.2.3.tgz");
        let limits = ChartLimits::default();
        let cache = cache("ok");
        let auth = ("u".to_string(), "p".to_string());
        let path = fetch_url(
            &http(),
            &cache,
            &helm(chart.clone(), Some("1.2.3")),
            Some(&auth),
            &limits,
        )
        .await
        .expect("fetched");
        assert_eq!(std::fs::read(&path).unwrap(), tgz, "cached as served");
        let head = seen.lock().unwrap()[0].to_ascii_lowercase();
        assert!(head.starts_with("get /charts/app-1.2.3.tgz "), "{head}");
        assert!(
            head.contains("authorization: basic dtpw"),
            "credentials to the URL's origin: {head}"
        );

        // Any version when none is set; another version is refused, naming both.
        assert!(
            fetch_url(&http(), &cache, &helm(chart.clone(), None), None, &limits)
                .await
                .is_ok()
        );
        let e = fetch_url(&http(), &cache, &helm(chart, Some("2.0.0")), None, &limits)
            .await
            .unwrap_err();
        assert_eq!(e.reason, reason::CHART_VERSION_NOT_FOUND);
        assert!(
            e.to_string()
                .contains("\"2.0.0\" but the archive's Chart.yaml says \"1.2.3\""),
            "{e}"
        );
    }

    #[tokio::test]
    async fn an_absolute_url_keeps_the_bounds_and_redirect_rule_of_a_repository() {
        let (other, _) = serve(|_| ok(b"elsewhere")).await;
        let (url, _) = serve(move |path| {
            if path == "/big.tgz" {
                ok(&vec![0u8; 4096])
            } else {
                format!("HTTP/1.1 302 Found\r\nLocation: {other}/x.tgz\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").into_bytes()
            }
        })
        .await;
        let cache = cache("bounds");
        let limits = ChartLimits {
            max_chart_bytes: 1024,
            ..ChartLimits::default()
        };
        let e = fetch_url(
            &http(),
            &cache,
            &helm(format!("{url}/big.tgz"), None),
            None,
            &limits,
        )
        .await
        .unwrap_err();
        assert_eq!(e.reason, reason::CHART_TOO_LARGE);
        let e = fetch_url(
            &http(),
            &cache,
            &helm(format!("{url}/moved.tgz"), None),
            None,
            &limits,
        )
        .await
        .unwrap_err();
        assert_eq!(e.reason, reason::CHART_REDIRECT_REFUSED);
    }
}
