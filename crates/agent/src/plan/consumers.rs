//! `rolloutOnCopyChange`: the workloads of a deployment that consume a copied Secret or
//! ConfigMap get the pod-template annotation [`labels::COPIES_HASH`], the hash of the content
//! hashes of the copies they consume, so a rotation rolls them as Reloader and Sveltos do
//! (decision 0098-rollout-on-copy-change). Pure, and only ever on the Bundle's own manifests:
//! the annotation is part of the desired body, so nothing is written unless a copy changed.

use std::collections::BTreeSet;

use serde_json::{Value, json};
use tender_types::hash::value_hash;
use tender_types::{BundleDeploymentOptions, SourceKind, labels, namespaces};

/// The pod template of a workload manifest, by kind (`None`: not a workload tender rolls —
/// a Job's template is immutable, a bare Pod cannot be rolled).
fn pod_template(body: &mut Value) -> Option<&mut Value> {
    let api_version = body["apiVersion"].as_str().unwrap_or_default();
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    let kind = body["kind"].as_str().unwrap_or_default();
    let path = match (group, kind) {
        ("apps", "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet")
        | ("", "ReplicationController") => "/spec/template",
        ("batch", "CronJob") => "/spec/jobTemplate/spec/template",
        _ => return None,
    };
    body.pointer_mut(path).filter(|t| t.is_object())
}

/// The Secrets and ConfigMaps a pod spec consumes by name: env `valueFrom`, `envFrom`,
/// volumes (also projected) and `imagePullSecrets`.
pub fn consumed(pod_spec: &Value) -> BTreeSet<(SourceKind, String)> {
    let mut out = BTreeSet::new();
    let mut add = |kind: SourceKind, name: &Value| {
        if let Some(n) = name.as_str() {
            out.insert((kind, n.to_string()));
        }
    };
    let containers = ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .filter_map(|k| pod_spec[*k].as_array())
        .flatten();
    for c in containers {
        for env in c["env"].as_array().into_iter().flatten() {
            add(
                SourceKind::Secret,
                &env["valueFrom"]["secretKeyRef"]["name"],
            );
            add(
                SourceKind::ConfigMap,
                &env["valueFrom"]["configMapKeyRef"]["name"],
            );
        }
        for from in c["envFrom"].as_array().into_iter().flatten() {
            add(SourceKind::Secret, &from["secretRef"]["name"]);
            add(SourceKind::ConfigMap, &from["configMapRef"]["name"]);
        }
    }
    for v in pod_spec["volumes"].as_array().into_iter().flatten() {
        add(SourceKind::Secret, &v["secret"]["secretName"]);
        add(SourceKind::ConfigMap, &v["configMap"]["name"]);
        for s in v["projected"]["sources"].as_array().into_iter().flatten() {
            add(SourceKind::Secret, &s["secret"]["name"]);
            add(SourceKind::ConfigMap, &s["configMap"]["name"]);
        }
    }
    for s in pod_spec["imagePullSecrets"]
        .as_array()
        .into_iter()
        .flatten()
    {
        add(SourceKind::Secret, &s["name"]);
    }
    out
}

/// Sets [`labels::COPIES_HASH`] on the pod template of `body` (a manifest applied in
/// `namespace`) when the deployment asks for it and the pods consume one of its copies there.
pub fn annotate(body: &mut Value, namespace: Option<&str>, options: &BundleDeploymentOptions) {
    if !options.rollout_on_copy_change {
        return;
    }
    let copies_ns = namespaces::copies_namespace(
        options.target_namespace.as_deref(),
        Some(options.default_namespace.as_str()).filter(|d| !d.is_empty()),
    );
    if namespace != Some(copies_ns) {
        return;
    }
    let Some(template) = pod_template(body) else {
        return;
    };
    let uses = consumed(&template["spec"]);
    let hashes: Vec<Value> = options
        .downstream_resources
        .iter()
        .filter(|c| c.api_version() == "v1")
        .filter_map(|c| {
            let kind = SourceKind::parse(&c.kind)?;
            uses.contains(&(kind, c.name.clone()))
                .then(|| json!([c.kind, c.name, c.hash]))
        })
        .collect();
    if hashes.is_empty() {
        return;
    }
    let hash = value_hash(&Value::Array(hashes));
    let meta = &mut template["metadata"];
    if !meta.is_object() {
        *meta = json!({});
    }
    let annotations = &mut meta["annotations"];
    if !annotations.is_object() {
        *annotations = json!({});
    }
    annotations[labels::COPIES_HASH] = Value::String(hash);
}

#[cfg(test)]
mod tests {
    use super::*;
    use tender_types::CopiedResource;

    fn copy(kind: &str, name: &str, hash: &str) -> CopiedResource {
        CopiedResource {
            api_version: None,
            kind: kind.into(),
            name: name.into(),
            copy_name: format!("b-{name}"),
            hash: hash.into(),
        }
    }

    fn options(on: bool, db_hash: &str) -> BundleDeploymentOptions {
        BundleDeploymentOptions {
            default_namespace: "apps".into(),
            rollout_on_copy_change: on,
            downstream_resources: vec![
                copy("Secret", "db", db_hash),
                copy("ConfigMap", "settings", "c1"),
                copy("Secret", "unused", "u1"),
            ],
            ..Default::default()
        }
    }

    fn deployment(pod_spec: Value) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "apps"},
            "spec": {"template": {"metadata": {"labels": {"app": "web"}}, "spec": pod_spec}}
        })
    }

    fn annotation(body: &Value) -> Option<&str> {
        body["spec"]["template"]["metadata"]["annotations"][labels::COPIES_HASH].as_str()
    }

    #[test]
    fn every_way_of_consuming_is_found() {
        let spec = json!({
            "initContainers": [{"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s1", "key": "k"}}}]}],
            "containers": [{
                "env": [{"name": "B", "valueFrom": {"configMapKeyRef": {"name": "c1", "key": "k"}}},
                        {"name": "C", "value": "plain"}],
                "envFrom": [{"secretRef": {"name": "s2"}}, {"configMapRef": {"name": "c2"}}]
            }],
            "volumes": [
                {"name": "v1", "secret": {"secretName": "s3"}},
                {"name": "v2", "configMap": {"name": "c3"}},
                {"name": "v3", "projected": {"sources": [{"secret": {"name": "s4"}}, {"configMap": {"name": "c4"}}, {"serviceAccountToken": {"path": "t"}}]}},
                {"name": "v4", "emptyDir": {}}
            ],
            "imagePullSecrets": [{"name": "s5"}]
        });
        let found = consumed(&spec);
        let want: BTreeSet<(SourceKind, String)> = [
            (SourceKind::Secret, "s1"),
            (SourceKind::Secret, "s2"),
            (SourceKind::Secret, "s3"),
            (SourceKind::Secret, "s4"),
            (SourceKind::Secret, "s5"),
            (SourceKind::ConfigMap, "c1"),
            (SourceKind::ConfigMap, "c2"),
            (SourceKind::ConfigMap, "c3"),
            (SourceKind::ConfigMap, "c4"),
        ]
        .into_iter()
        .map(|(k, n)| (k, n.to_string()))
        .collect();
        assert_eq!(found, want);
    }

    #[test]
    fn the_annotation_follows_the_consumed_copies_content_only() {
        let spec = json!({"volumes": [{"name": "db", "secret": {"secretName": "db"}}]});
        let mut before = deployment(spec.clone());
        annotate(&mut before, Some("apps"), &options(true, "h1"));
        let first = annotation(&before).expect("annotated").to_string();
        // Same content: same body (no write).
        let mut again = deployment(spec.clone());
        annotate(&mut again, Some("apps"), &options(true, "h1"));
        assert_eq!(again, before);
        // The consumed Secret rotated: a new value.
        let mut rotated = deployment(spec.clone());
        annotate(&mut rotated, Some("apps"), &options(true, "h2"));
        assert_ne!(annotation(&rotated).unwrap(), first);
        // An unconsumed copy changing leaves it alone.
        let mut o = options(true, "h1");
        o.downstream_resources[2].hash = "u2".into();
        let mut other = deployment(spec);
        annotate(&mut other, Some("apps"), &o);
        assert_eq!(annotation(&other).unwrap(), first);
        // The hash never contains the content hash itself verbatim.
        assert!(!first.contains("h1"));
    }

    #[test]
    fn nothing_is_annotated_without_the_field_a_consumer_or_a_workload() {
        let spec = json!({"volumes": [{"name": "db", "secret": {"secretName": "db"}}]});
        let mut off = deployment(spec.clone());
        annotate(&mut off, Some("apps"), &options(false, "h1"));
        assert_eq!(off, deployment(spec.clone()));
        // A Secret of that name in another namespace is not the copy.
        let mut elsewhere = deployment(spec.clone());
        annotate(&mut elsewhere, Some("other"), &options(true, "h1"));
        assert_eq!(annotation(&elsewhere), None);
        // No consumer of a copy.
        let plain = json!({"containers": [{"name": "c", "image": "x"}]});
        let mut unconsumed = deployment(plain.clone());
        annotate(&mut unconsumed, Some("apps"), &options(true, "h1"));
        assert_eq!(unconsumed, deployment(plain));
        // A Job (immutable template) and a Service are left alone.
        for (api, kind) in [("batch/v1", "Job"), ("v1", "Service"), ("v1", "Pod")] {
            let mut body = json!({"apiVersion": api, "kind": kind, "spec": {"template": {"spec": spec.clone()}}});
            let copy = body.clone();
            annotate(&mut body, Some("apps"), &options(true, "h1"));
            assert_eq!(body, copy, "{kind}");
        }
    }

    #[test]
    fn statefulsets_daemonsets_and_cronjobs_are_annotated() {
        let spec = json!({"containers": [{"envFrom": [{"configMapRef": {"name": "settings"}}]}]});
        for kind in ["StatefulSet", "DaemonSet", "ReplicaSet"] {
            let mut body = json!({"apiVersion": "apps/v1", "kind": kind, "spec": {"template": {"spec": spec.clone()}}});
            annotate(&mut body, Some("apps"), &options(true, "h1"));
            assert!(annotation(&body).is_some(), "{kind}");
        }
        let mut cron = json!({"apiVersion": "batch/v1", "kind": "CronJob",
            "spec": {"jobTemplate": {"spec": {"template": {"spec": spec}}}}});
        annotate(&mut cron, Some("apps"), &options(true, "h1"));
        assert!(
            cron["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["annotations"]
                [labels::COPIES_HASH]
                .is_string()
        );
    }
}
