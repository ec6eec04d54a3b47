//! The hub's looks at chart repositories for `pollingInterval`: `index.yaml` or an OCI tag
//! list per (namespace, repository, chart, credentials) at most once per interval, within
//! [`super::POLL_TIMEOUT`] and [`super::MAX_INDEX_BYTES`], redirects only on the repository's
//! origin — through the chart-repository client the agent uses too (`tender_chartrepo`,
//! decision 0117-one-chart-repository-client), with the system's roots.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

// tokio's monotonic clock, the system's unless a test paused it (decision
// 0116-hub-clock-and-fake-apiserver): the interval between looks is then virtual time too.
use tokio::time::Instant;

use tender_chartrepo::{Budget, Http, Session, Side, Trust, parse_reference, system_roots};
use tender_types::HelmOptions;
use tender_types::conditions::reason;

use super::{Credentials, Failure, MAX_INDEX_BYTES, POLL_TIMEOUT, source};

/// Who the shared chart-repository client works for: the hub's `User-Agent` and hints.
const HUB: Side = Side {
    user_agent: concat!("tender-hub/", env!("CARGO_PKG_VERSION")),
    redirect_hint: " (the hub follows redirects on the repository's origin only)",
    without_credentials_hint: " (set helmSecretName to a Secret with username and password, \
                               listed in downstreamResources)",
};

/// (namespace, repository or oci reference, chart, credentials): one look per interval each.
type Key = (String, String, String, Option<Credentials>);
/// When a look was made, and the versions it found (or why it failed).
type Look = (Instant, Result<Vec<String>, Failure>);

/// The hub's looks at chart repositories, shared by the Bundles of a scope.
pub struct Poller {
    http: Http,
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
        let tls = Trust::default().client_config(&system_roots());
        Self {
            http: Http::new(HUB, Vec::new(), tls),
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
        let pair = credentials
            .as_ref()
            .map(|c| (c.username.clone(), c.password.clone()));
        let look = async {
            if helm.is_oci() {
                self.oci_tags(helm, pair.as_ref()).await
            } else {
                self.index_versions(helm, pair.as_ref()).await
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
        credentials: Option<&(String, String)>,
    ) -> Result<Vec<String>, Failure> {
        let repo = helm.repo.as_deref().unwrap_or_default();
        let entries = self
            .http
            .chart_entries(repo, &helm.chart, credentials, budget("repository index"))
            .await?;
        Ok(entries.into_iter().map(|e| e.version).collect())
    }

    /// An OCI registry's tags of the chart's repository (Basic, or a Bearer token from the
    /// realm the registry names, with the credentials when there are some), as versions.
    async fn oci_tags(
        &self,
        helm: &HelmOptions,
        credentials: Option<&(String, String)>,
    ) -> Result<Vec<String>, Failure> {
        let oci = parse_reference(&helm.chart)
            .map_err(|m| Failure::new(reason::CHART_REPOSITORY_UNREACHABLE, m))?;
        let mut session = Session::new(
            &self.http,
            &oci,
            &helm.chart,
            credentials,
            helm.basic_http,
            budget("registry response"),
        );
        let tags = session.tags(&oci.repository).await?;
        Ok(tags.into_iter().map(|t| t.replace('_', "+")).collect())
    }
}

/// At most [`MAX_INDEX_BYTES`] of one answer (or of one tag list, all its pages).
fn budget(what: &'static str) -> Budget {
    Budget::new(MAX_INDEX_BYTES as u64, what, "the hub's bound on one look")
}
