//! The hub's metric families against what docs/monitoring.md says the charts read.

use tender_runtime::metrics::{documented_metrics, series_labels};

use crate::{HubMetrics, KindLabels};

/// Every row of docs/monitoring.md's metrics table that names the hub is a series the hub's
/// registry encodes, with the labels listed (the charts' rules and dashboards read only those
/// rows; `e2e/tests/suite/charts.rs` checks that side).
#[test]
fn monitoring_doc_lists_only_exported_metrics() {
    let mut base = tender_runtime::Metrics::new();
    let hub = HubMetrics::register(&mut base);
    // One sample in every labelled family.
    drop(base.reconcile("bundle"));
    base.reconcile_error("bundle", "Conflict");
    base.kube_request("get", "secrets", "");
    drop(base.kube_request_in_flight("get", "secrets", ""));
    base.object_write("apply", "Secret");
    base.object_write_skipped("apply", "Secret");
    hub.status_writes
        .get_or_create(&KindLabels {
            kind: "Bundle".into(),
        })
        .inc();
    hub.fanout_duration.observe(0.1);
    let exported = series_labels(&base.encode());
    let doc = include_str!("../../../../docs/monitoring.md");
    let rows = documented_metrics(doc, "hub");
    assert!(rows.len() >= 10, "{rows:?}");
    for (metric, labels) in rows {
        let Some(have) = exported.get(&metric) else {
            panic!("docs/monitoring.md lists {metric}, which the hub does not export");
        };
        for label in labels {
            assert!(
                have.contains(&label),
                "{metric} has no label {label}: {have:?}"
            );
        }
    }
}
