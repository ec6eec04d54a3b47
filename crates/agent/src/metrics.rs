//! The agent's own metric families, `tender_agent_*`, registered next to the common ones of
//! `tender_runtime` (whose `tender_object_writes_total` counts every executor write by verb,
//! inventories and hub writes included; `tender_agent_objects_written_total` counts only
//! what happened to managed downstream objects, by the agent's action).
//!
//! Never labelled with object names or data: only kinds, actions and results.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tender_runtime::Metrics;

/// Labels of `tender_agent_objects_written_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// `apply`, `recreate`, `delete` or `strip`.
    pub action: String,
    /// Kind of the downstream object.
    pub kind: String,
}

/// Labels of `tender_agent_heartbeats_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HeartbeatLabels {
    /// `lease` or `cluster_status`.
    pub target: String,
    /// `ok` or `error`.
    pub result: String,
}

/// The common registry plus the agent's families; cheap to clone.
#[derive(Clone, Debug)]
pub struct AgentMetrics {
    base: Arc<Metrics>,
    objects_written: Family<WriteLabels, Counter>,
    deployments: Counter,
    drift_detected: Counter,
    drift_corrected: Counter,
    conflicts: Counter,
    heartbeats: Family<HeartbeatLabels, Counter>,
    swept: Counter,
    hub_access_lost: Gauge,
}

impl AgentMetrics {
    /// Registers the agent families into `metrics` and shares it.
    pub fn register(mut metrics: Metrics) -> Self {
        let objects_written = Family::<WriteLabels, Counter>::default();
        let deployments = Counter::default();
        let drift_detected = Counter::default();
        let drift_corrected = Counter::default();
        let conflicts = Counter::default();
        let heartbeats = Family::<HeartbeatLabels, Counter>::default();
        let swept = Counter::default();
        let hub_access_lost = Gauge::default();
        let r = metrics
            .registry_mut()
            .sub_registry_with_prefix("tender_agent");
        r.register(
            "objects_written",
            "Downstream writes by action (apply, recreate, delete, strip) and kind",
            objects_written.clone(),
        );
        r.register(
            "deployments",
            "BundleDeployment deploymentIDs applied completely",
            deployments.clone(),
        );
        r.register(
            "drift_detected",
            "Downstream objects found changed or deleted behind tender's back",
            drift_detected.clone(),
        );
        r.register(
            "drift_corrected",
            "Drifted downstream objects restored",
            drift_corrected.clone(),
        );
        r.register(
            "conflicts",
            "Objects left untouched because somebody else owns them (per reconcile)",
            conflicts.clone(),
        );
        r.register(
            "heartbeats",
            "Heartbeat writes to the hub by target and result",
            heartbeats.clone(),
        );
        r.register(
            "swept_objects",
            "Downstream objects of vanished BundleDeployments removed or released at start-up",
            swept.clone(),
        );
        r.register(
            "hub_access_lost",
            "Whether the hub refuses the agent's identity (401/403) or its Cluster does not exist (HubAccessLost; 1 = yes); nothing is deleted downstream meanwhile",
            hub_access_lost.clone(),
        );
        Self {
            base: Arc::new(metrics),
            objects_written,
            deployments,
            drift_detected,
            drift_corrected,
            conflicts,
            heartbeats,
            swept,
            hub_access_lost,
        }
    }

    /// The shared registry, for the request-counting clients and the HTTP server.
    pub fn shared(&self) -> Arc<Metrics> {
        self.base.clone()
    }

    /// Total downstream writes of `action` (all kinds), for tests.
    pub fn writes(&self, action: &str) -> u64 {
        ["Secret", "ConfigMap", "Namespace"]
            .iter()
            .map(|k| self.writes_of(action, k))
            .sum()
    }

    /// Downstream writes of `action` on `kind`.
    pub fn writes_of(&self, action: &str, kind: &str) -> u64 {
        self.objects_written
            .get(&WriteLabels {
                action: action.into(),
                kind: kind.into(),
            })
            .map_or(0, |c| c.get())
    }

    /// Drift corrections so far.
    pub fn drift_corrected(&self) -> u64 {
        self.drift_corrected.get()
    }

    pub(crate) fn written(&self, action: &str, kind: &str) {
        self.objects_written
            .get_or_create(&WriteLabels {
                action: action.into(),
                kind: kind.into(),
            })
            .inc();
    }

    pub(crate) fn deployed(&self) {
        self.deployments.inc();
    }

    pub(crate) fn drift(&self, corrected: bool) {
        self.drift_detected.inc();
        if corrected {
            self.drift_corrected.inc();
        }
    }

    pub(crate) fn conflict(&self) {
        self.conflicts.inc();
    }

    pub(crate) fn heartbeat(&self, target: &str, ok: bool) {
        self.heartbeats
            .get_or_create(&HeartbeatLabels {
                target: target.into(),
                result: if ok { "ok" } else { "error" }.into(),
            })
            .inc();
    }

    pub(crate) fn swept(&self) {
        self.swept.inc();
    }

    pub(crate) fn hub_access(&self, lost: bool) {
        self.hub_access_lost.set(i64::from(lost));
    }

    /// Whether the hub refuses the agent (or its Cluster is gone), for tests.
    pub fn hub_access_lost(&self) -> bool {
        self.hub_access_lost.get() == 1
    }

    /// The shared registry, borrowed.
    pub fn base(&self) -> &Metrics {
        &self.base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_carry_the_agent_prefix() {
        let metrics = AgentMetrics::register(Metrics::new());
        metrics.written("strip", "Secret");
        metrics.heartbeat("lease", false);
        assert_eq!(metrics.writes("strip"), 1);
        assert_eq!(metrics.writes_of("strip", "Secret"), 1);
        let text = metrics.shared().encode();
        assert!(
            text.contains("tender_agent_objects_written_total{action=\"strip\",kind=\"Secret\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("tender_agent_heartbeats_total{target=\"lease\",result=\"error\"} 1"),
            "{text}"
        );
        assert!(!text.lines().any(|l| l.starts_with("agent_")), "{text}");
        assert!(
            text.lines().any(|l| l == "tender_agent_hub_access_lost 0"),
            "{text}"
        );
        metrics.hub_access(true);
        assert!(metrics.hub_access_lost());
        assert!(
            metrics
                .shared()
                .encode()
                .lines()
                .any(|l| l == "tender_agent_hub_access_lost 1")
        );
    }

    /// Every row of docs/monitoring.md's metrics table that names the agent is a series the
    /// agent's registry encodes, with the labels listed (the charts' rules and dashboards read
    /// only those rows; `e2e/tests/suite/charts.rs` checks that side).
    #[test]
    fn monitoring_doc_lists_only_exported_metrics() {
        let metrics = AgentMetrics::register(Metrics::new());
        let base = metrics.shared();
        // One sample in every labelled family.
        drop(base.reconcile("bundledeployment"));
        base.reconcile_error("bundledeployment", "Conflict");
        base.kube_request("get", "secrets", "");
        drop(base.kube_request_in_flight("get", "secrets", ""));
        base.object_write("apply", "Secret");
        base.object_write_skipped("apply", "Secret");
        metrics.written("apply", "Secret");
        metrics.heartbeat("lease", true);
        let exported = tender_runtime::metrics::series_labels(&base.encode());
        let doc = include_str!("../../../docs/monitoring.md");
        let rows = tender_runtime::metrics::documented_metrics(doc, "agent");
        assert!(rows.len() >= 10, "{rows:?}");
        for (metric, labels) in rows {
            let Some(have) = exported.get(&metric) else {
                panic!("docs/monitoring.md lists {metric}, which the agent does not export");
            };
            for label in labels {
                assert!(
                    have.contains(&label),
                    "{metric} has no label {label}: {have:?}"
                );
            }
        }
    }
}
