//! What the apiserver fills in is not drift (issue 22): kinds it defaults heavily — a CRD, a
//! Deployment, a Service, a webhook configuration — applied by a Bundle are written once, and
//! the agent neither reports them "restored after downstream drift" nor writes them again.

use std::time::Duration;

use serde_json::json;
use tender_e2e::fixture::{Workspace, stays};
use tender_e2e::{downstream_name, shared_env_of, unique_name};

/// `tender_agent_<family>_total` of the agent's metrics, summed over labels.
fn counter(agent: &tender_e2e::fixture::Agent, family: &str) -> u64 {
    let prefix = format!("tender_agent_{family}_total");
    agent
        .handle()
        .metrics
        .shared()
        .encode()
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test]
async fn defaulted_kinds_are_written_once_and_never_restored() {
    let ws = Workspace::new(shared_env_of("apiserver-defaults", 1).await, "defaults").await;
    // The owner allows every kind here: CRDs and webhooks are refused by default.
    let east = ws
        .agent_configured("east", &downstream_name(1), |c| {
            c.policy.refused_kinds.clear();
        })
        .await;
    // A CRD nobody here wrote (Kyverno's, from its module archive), as its authors ship it.
    let mut kyverno_crd = serde_json::to_value(
        tender_e2e::kyverno::crd("kyverno.io_cleanuppolicies.yaml").expect("Kyverno's CRD"),
    )
    .unwrap();
    kyverno_crd.as_object_mut().unwrap().remove("status");
    let target = unique_name("defaults");
    let group = format!("{}.e2e.tender.dev", unique_name("d"));
    let webhook = unique_name("defaults-webhook");
    ws.bundle(
        "app",
        json!({
            "targets": [{"clusterName": "east"}],
            "defaultNamespace": target,
            "resources": [
                {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                 "metadata": {"name": format!("gadgets.{group}")},
                 "spec": {"group": group, "scope": "Namespaced",
                     "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
                     "versions": [{"name": "v1", "served": true, "storage": true,
                         "schema": {"openAPIV3Schema": {"type": "object",
                             "properties": {"spec": {"type": "object",
                                 "properties": {"size": {"type": "integer", "default": 1}}}}}}}]}},
                kyverno_crd,
                // An object of the CRD applied with it: KindNotInstalled until it is served.
                {"apiVersion": format!("{group}/v1"), "kind": "Gadget",
                 "metadata": {"name": "g"}, "spec": {}},
                {"apiVersion": "apps/v1", "kind": "Deployment",
                 "metadata": {"name": "web"},
                 "spec": {"replicas": 0,
                     "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}},
                         "spec": {"containers": [{"name": "web", "image": "registry.example/web:1",
                             "ports": [{"containerPort": 8080}]}]}}}},
                {"apiVersion": "v1", "kind": "Service",
                 "metadata": {"name": "web"},
                 "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}},
                {"apiVersion": "admissionregistration.k8s.io/v1",
                 "kind": "ValidatingWebhookConfiguration",
                 "metadata": {"name": webhook},
                 "webhooks": [{"name": "check.e2e.tender.dev",
                     "clientConfig": {"url": "https://127.0.0.1:1/check"},
                     "rules": [{"apiGroups": [group], "apiVersions": ["v1"],
                         "operations": ["CREATE"], "resources": ["gadgets"]}],
                     "sideEffects": "None", "admissionReviewVersions": ["v1"],
                     "failurePolicy": "Ignore"}]},
            ],
        }),
    )
    .await;
    ws.ready("east", "app").await;
    let written = counter(&east, "objects_written");
    assert!(written >= 6, "the six objects were written: {written}");
    // More than one of the agent's periodic re-checks: nothing is judged drifted or written.
    stays(
        "drift corrections and downstream writes after the first apply",
        Duration::from_secs(35),
        &(0, written),
        || async {
            (
                counter(&east, "drift_corrected"),
                counter(&east, "objects_written"),
            )
        },
    )
    .await;
}
