//! A chart repository's `index.yaml`: fetched within a budget, parsed, one chart's entries.

use tender_types::chart_version::{ChartEntry, parse_index};
use tender_types::conditions::reason;

use crate::{Budget, Failure, Http, absolute, without_userinfo};

/// The URL of `repo`'s index.
pub fn index_url(repo: &str) -> String {
    absolute(repo, "index.yaml")
}

impl Http {
    /// The entries (every version) of `chart` in the index of repository `repo`.
    pub async fn chart_entries(
        &self,
        repo: &str,
        chart: &str,
        auth: Option<&(String, String)>,
        budget: Budget,
    ) -> Result<Vec<ChartEntry>, Failure> {
        let url = index_url(repo);
        let body = self.get(&url, repo, auth, budget).await?;
        let shown = without_userinfo(&url);
        let mut index = parse_index(&String::from_utf8_lossy(&body)).map_err(|_| {
            Failure::new(
                reason::CHART_REPOSITORY_UNREACHABLE,
                format!("{shown} is not a chart repository index"),
            )
        })?;
        index.remove(chart).ok_or_else(|| {
            Failure::new(
                reason::CHART_VERSION_NOT_FOUND,
                format!("chart {chart:?} is not in {shown}"),
            )
        })
    }
}
