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
    // The state gauges count what the caches hold: a Cluster, a halted Bundle and a
    // BundleDeployment its agent reported not ready.
    let mut bundle = tender_types::Bundle::new("b", Default::default());
    bundle.status = Some(tender_types::bundle::BundleStatus {
        conditions: vec![condition("RolloutHalted", "True", "WaveFailed")],
        ..Default::default()
    });
    let mut bd = tender_types::BundleDeployment::new("b", Default::default());
    bd.status = Some(tender_types::bundle_deployment::BundleDeploymentStatus {
        conditions: vec![condition("Ready", "False", "CopySignatureInvalid")],
        ..Default::default()
    });
    let _attached = hub.state.attach(
        Some((
            store(tender_types::Cluster::new("c", Default::default())),
            store(bundle),
        )),
        store(bd),
    );
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

fn condition(
    type_: &str,
    status: &str,
    reason: &str,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: String::new(),
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ),
        observed_generation: None,
    }
}

/// A cache holding `object` (named, in namespace `ws`).
fn store<K>(mut object: K) -> kube::runtime::reflector::Store<K>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    use kube::runtime::watcher::Event;
    object.meta_mut().namespace = Some("ws".into());
    let mut w = kube::runtime::reflector::store::Writer::<K>::default();
    w.apply_watcher_event(&Event::Init);
    w.apply_watcher_event(&Event::InitApply(object));
    w.apply_watcher_event(&Event::InitDone);
    w.as_reader()
}
