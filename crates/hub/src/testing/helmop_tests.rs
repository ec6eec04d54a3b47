//! The HelmOp controller in-process: the Bundle `helmop::reconcile` writes for a HelmOp, the
//! Bundle's status brought back onto the HelmOp, and a Bundle of the same name it does not own
//! left alone.

use serde_json::json;
use tender_types::conditions::{self, TYPE_READY, reason};

use super::*;

/// HelmOp spec: chart `app` at `version` on every `env=prod` cluster.
fn helmop_spec(version: &str) -> Value {
    json!({
        "helm": {"releaseName": "web", "repo": "https://charts.example.com", "chart": "app",
                 "version": version},
        "targets": [{"clusterSelector": {"matchLabels": {"env": "prod"}}}],
    })
}

fn chart_version(bundle: &Bundle) -> Option<String> {
    bundle.spec.helm.as_ref()?.version.clone()
}

#[tokio::test(start_paused = true)]
async fn a_helmop_writes_its_bundle_and_takes_back_its_status() {
    let hub = TestHub::new();
    hub.cluster("one", &[("env", "prod")]);
    let helmop = hub.helmop("web", helmop_spec("1.2.3"));
    hub.take_writes();

    hub.reconcile_helmop("web").await;
    assert_eq!(
        hub.take_writes(),
        [format!("apply bundles {WS}/web")],
        "no status before the Bundle is reported on"
    );
    let bundle: Bundle = hub.get(Some(WS), "web").expect("its Bundle");
    assert_eq!(chart_version(&bundle).as_deref(), Some("1.2.3"));
    assert_eq!(
        bundle.metadata.owner_references.expect("owned")[0].uid,
        helmop.metadata.uid.clone().expect("uid"),
        "owned by the HelmOp"
    );
    hub.reconcile_helmop("web").await;
    assert_eq!(hub.take_writes(), Vec::<String>::new(), "idle");

    // The Bundle controller takes it from there (its finalizer, then the fan-out and status).
    hub.reconcile_bundle("web").await;
    hub.reconcile_bundle("web").await;
    let writes = hub.take_writes();
    assert!(
        writes.contains(&format!(
            "apply bundledeployments {}/web",
            names::cluster_namespace(WS, "one")
        )),
        "{writes:#?}"
    );
    hub.reconcile_helmop("web").await;
    assert_eq!(hub.take_writes(), [format!("status helmops {WS}/web")]);
    let stored: HelmOp = hub.get(Some(WS), "web").expect("HelmOp");
    let bundle: Bundle = hub.get(Some(WS), "web").expect("Bundle");
    let status = stored.status.expect("status");
    let ready = conditions::find_condition(&status.conditions, TYPE_READY).expect("Ready");
    let bundle_ready = conditions::find_condition(
        &bundle.status.as_ref().expect("Bundle status").conditions,
        TYPE_READY,
    )
    .expect("Bundle Ready");
    assert_eq!(
        (&ready.status, &ready.reason),
        (&bundle_ready.status, &bundle_ready.reason),
        "the Bundle's Ready, carried over"
    );
    assert_eq!(ready.observed_generation, stored.metadata.generation);
    hub.reconcile_helmop("web").await;
    assert_eq!(hub.take_writes(), Vec::<String>::new(), "idle");

    // A new version: the Bundle follows, the HelmOp's status waits for the Bundle's report.
    hub.edit::<HelmOp>(Some(WS), "web", |h| {
        h["spec"]["helm"]["version"] = "1.2.4".into()
    });
    hub.reconcile_helmop("web").await;
    assert_eq!(hub.take_writes(), [format!("apply bundles {WS}/web")]);
    let bundle: Bundle = hub.get(Some(WS), "web").expect("Bundle");
    assert_eq!(chart_version(&bundle).as_deref(), Some("1.2.4"));
}

#[tokio::test(start_paused = true)]
async fn a_bundle_of_the_same_name_it_does_not_own_is_left_alone() {
    let hub = TestHub::new();
    hub.cluster("one", &[("env", "prod")]);
    let theirs = hub.bundle("web", json!({"targets": [{"clusterName": "one"}]}));
    hub.helmop("web", helmop_spec("1.2.3"));
    hub.take_writes();

    hub.reconcile_helmop("web").await;
    assert_eq!(
        hub.take_writes(),
        [format!("status helmops {WS}/web")],
        "only its own status"
    );
    let stored: HelmOp = hub.get(Some(WS), "web").expect("HelmOp");
    let ready = conditions::find_condition(&stored.status.expect("status").conditions, TYPE_READY)
        .cloned()
        .expect("Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", reason::BUNDLE_CONFLICT)
    );
    let bundle: Bundle = hub.get(Some(WS), "web").expect("Bundle");
    assert_eq!(
        bundle.metadata.resource_version, theirs.metadata.resource_version,
        "untouched"
    );
    hub.reconcile_helmop("web").await;
    assert_eq!(hub.take_writes(), Vec::<String>::new(), "idle");
}

#[tokio::test(start_paused = true)]
async fn a_helmop_without_targets_goes_to_the_default_group_as_in_fleet() {
    let hub = TestHub::new();
    hub.cluster("one", &[("env", "prod")]);
    hub.cluster("two", &[("env", "dev")]);
    let mut spec = helmop_spec("1.2.3");
    spec.as_object_mut().expect("object").remove("targets");
    hub.helmop("web", spec);
    hub.reconcile_helmop("web").await;
    let bundle: Bundle = hub.get(Some(WS), "web").expect("its Bundle");
    assert_eq!(bundle.spec.targets.len(), 1);
    assert_eq!(
        bundle.spec.targets[0].cluster_group.as_deref(),
        Some("default")
    );

    // No group `default` yet: no cluster.
    hub.reconcile_bundle("web").await;
    hub.reconcile_bundle("web").await;
    assert!(hub.fake.all::<BundleDeployment>().is_empty());

    // The group `default` of the namespace decides, as Fleet's does.
    hub.group("default", json!({"matchLabels": {"env": "dev"}}));
    hub.reconcile_bundle("web").await;
    let deployed: Vec<_> = hub
        .fake
        .all::<BundleDeployment>()
        .into_iter()
        .filter_map(|bd| bd.metadata.namespace)
        .collect();
    assert_eq!(deployed, [names::cluster_namespace(WS, "two")]);
}
