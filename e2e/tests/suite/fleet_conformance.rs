//! Issue 24, item 7: Fleet's own HelmOps (docs, e2e assets) and `fleet.yaml` helm options
//! (fleet-examples, fleet-test-data, integration assets) written as tender objects in
//! `e2e/fixtures/fleet/` — only the apiVersion and the chart source changed, each file naming
//! its source; issue 39: Fleet's Bundle `resources` (files), an absolute chart URL, and a chart
//! carried in files as `tender apply` writes it — applied to a real hub with two real agents, each with its expected outcome:
//! deployed on the clusters with the values Fleet would give each one, or refused with the
//! documented reason. docs/migrating-from-fleet.md states the same result per field.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::ApiResource;
use serde_json::{Value, json};
use tender_e2e::charts::RouteRepo;
use tender_e2e::fixture::{WAIT, Workspace};
use tender_e2e::{downstream_name, eventually, shared_env, unique_name};
use tender_types::{Bundle, Cluster, ClusterGroup, HelmOp};

/// What applying a fixture must do.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// Deployed on both clusters (`local`: env=dev, `east`: env=prod): the chart's
    /// `<release>-values` ConfigMap in `namespace` holds values containing, per cluster, the
    /// given subset.
    Deploys {
        release: &'static str,
        namespace: &'static str,
        local: &'static str,
        east: &'static str,
    },
    /// Deployed on both clusters: ConfigMap `name` in `namespace` holds `data` (JSON).
    ConfigMap {
        namespace: &'static str,
        name: &'static str,
        data: &'static str,
    },
    /// Accepted; no target selects a cluster (Fleet's page omits targets).
    /// Deployed on the clusters `on` only (`local` and/or `east`), the chart's `<release>-values`
    /// ConfigMap in `namespace`; the other cluster gets no BundleDeployment.
    DeploysOn {
        release: &'static str,
        namespace: &'static str,
        on: &'static [&'static str],
    },
    /// Accepted; no target selects a cluster.
    Accepted,
    /// Accepted; the BundleDeployments carry the chart in tender's form (`chart: oci://…`).
    OciNormalised,
    /// Refused by the apiserver with a message containing this.
    Refused(&'static str),
}

/// `@NS@` in a fixture and in `Deploys::namespace`.
const NS: &str = "@NS@";

/// Every fixture and its outcome (the migration guide's table says the same).
const FIXTURES: &[(&str, Expect)] = &[
    // No targets: Fleet's default target, the namespace's ClusterGroup `default` (here, as
    // Fleet's bootstrap group, the cluster `local`).
    (
        "docs-helm-ops.yaml",
        Expect::DeploysOn {
            release: "my-fantastic-chart",
            namespace: "that-amazing-namespace",
            on: &["local"],
        },
    ),
    (
        "e2e-helmop-polling-5s.yaml",
        Expect::DeploysOn {
            release: "testhelm",
            namespace: NS,
            on: &["local"],
        },
    ),
    (
        "e2e-helmop-polling-0.yaml",
        Expect::DeploysOn {
            release: "testhelm",
            namespace: "@NS@-zero",
            on: &["local"],
        },
    ),
    (
        "e2e-multi-cluster-helmop-multi-field-target.yaml",
        Expect::DeploysOn {
            release: "multi-field",
            namespace: "@NS@-fields",
            on: &["east"],
        },
    ),
    (
        "docs-helm-ops-absolute-url.yaml",
        Expect::Deploys {
            release: "absolute-url",
            namespace: "that-amazing-namespace",
            local: "{}",
            east: "{}",
        },
    ),
    (
        "e2e-multi-cluster-bundle-cm.yaml",
        Expect::ConfigMap {
            namespace: NS,
            name: "root",
            data: r#"{"value": "root"}"#,
        },
    ),
    (
        "files-name-escapes.yaml",
        Expect::Refused("resources[].name of a file must be a relative path without '..' segments"),
    ),
    (
        "files-chart-beside-fleet-yaml.yaml",
        Expect::Deploys {
            release: "files-chart",
            namespace: NS,
            local: r#"{"from": "bundle", "fromChart": true, "cluster": "dev"}"#,
            east: r#"{"from": "bundle", "fromChart": true, "cluster": "prod"}"#,
        },
    ),
    (
        "e2e-helmop-template.yaml",
        Expect::Deploys {
            release: "helmop-template",
            namespace: NS,
            local: "{}",
            east: "{}",
        },
    ),
    ("e2e-helmop-template-oci.yaml", Expect::OciNormalised),
    (
        "e2e-policy-helmop-minimal.yaml",
        Expect::Deploys {
            release: "helmop-minimal",
            namespace: NS,
            local: "{}",
            east: "{}",
        },
    ),
    (
        "e2e-multi-cluster-helmop.yaml",
        Expect::Deploys {
            release: "testhelm",
            namespace: "default",
            local: "{}",
            east: "{}",
        },
    ),
    (
        "e2e-multi-cluster-helmop-downstream-resources.yaml",
        Expect::Accepted,
    ),
    (
        "examples-multi-cluster-helm.yaml",
        Expect::Deploys {
            release: "mc-helm",
            namespace: "fleet-mc-helm-example",
            local: r#"{"replication": false}"#,
            east: r#"{"serviceType": "LoadBalancer", "replicas": 3}"#,
        },
    ),
    (
        "test-data-helm-cluster-values.yaml",
        Expect::Deploys {
            release: "helm-cluster-values",
            namespace: NS,
            local: r#"{"name": "name-local", "image": {"pullPolicy": "IfNotPresent",
                "repository": "rancher/mirrored-library-busybox"}, "clusterLabels": {"env": "dev"},
                "clusterValues": {}, "policy": "<no value>", "hostnames": ["one", "two", "three"],
                "annotations": {"app": "fleet", "more": "data"}, "replicaCount": 1}"#,
            east: r#"{"name": "name-east", "image": {"pullPolicy": "Always"},
                "clusterValues": {"policy": "Always"}, "policy": "Always"}"#,
        },
    ),
    (
        "test-data-namespace-labels.yaml",
        Expect::Deploys {
            release: "simple-chart",
            namespace: "ns-1",
            local: r#"{"name": "example-value"}"#,
            east: r#"{"name": "example-value"}"#,
        },
    ),
    (
        "examples-rancher-monitoring-diff.yaml",
        Expect::Deploys {
            release: "rancher-monitoring",
            namespace: NS,
            local: "{}",
            east: "{}",
        },
    ),
    ("integration-dependson-valid.yaml", Expect::Accepted),
];

const CHART: &str = "echo";
const VERSION: &str = "0.1.0";

/// The chart every fixture deploys: `<release>-values`, a ConfigMap holding the values it saw.
const TEMPLATE: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-values\ndata:\n  values.json: {{ toJson .Values | quote }}\n";

async fn chart_repo() -> RouteRepo {
    RouteRepo::serving_chart(
        CHART,
        VERSION,
        &[("templates/values.yaml", TEMPLATE.as_bytes())],
    )
    .await
    .expect("the chart repository")
}

fn fixture(file: &str, repo: &str, ns: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/fleet")
        .join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("@REPO@", repo)
        .replace("@CHART@", CHART)
        .replace("@VERSION@", VERSION)
        .replace(NS, ns);
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn resource(kind: &str) -> ApiResource {
    match kind {
        "HelmOp" => ApiResource::erase::<HelmOp>(&()),
        "Bundle" => ApiResource::erase::<Bundle>(&()),
        k => panic!("unexpected kind {k}"),
    }
}

/// The values the chart saw on one cluster (its ConfigMap), once it is there.
async fn values_seen(down: &kube::Client, ns: &str, release: &str) -> Value {
    let api = Api::<ConfigMap>::namespaced(down.clone(), ns);
    let name = format!("{release}-values");
    let text = eventually(&format!("{ns}/{name} deployed"), WAIT, || async {
        Ok::<_, kube::Error>(
            api.get_opt(&name)
                .await?
                .and_then(|c| c.data?.get("values.json").cloned()),
        )
    })
    .await;
    serde_json::from_str(&text).unwrap()
}

/// Waits until `bundle` is applied on both clusters; the namespace `namespace` stands for
/// (`@NS@` is the test's `ns`).
async fn applied_on_both<'a>(
    ws: &Workspace,
    bundle: &str,
    file: &str,
    namespace: &'a str,
    ns: &'a str,
) -> &'a str {
    for c in ["local", "east"] {
        ws.wait_applied(c, bundle, file).await;
    }
    if namespace == NS { ns } else { namespace }
}

/// Whether every key of `want` is in `got` with the same value (maps compared recursively).
fn contains(got: &Value, want: &Value) -> bool {
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => w
            .iter()
            .all(|(k, v)| g.get(k).is_some_and(|gv| contains(gv, v))),
        _ => got == want,
    }
}

#[tokio::test]
async fn fleets_own_helmops_and_fleet_yaml_helm_options_have_their_documented_outcome() {
    let repo = chart_repo().await;
    let ws = Workspace::new(shared_env(2).await, "fleet-conf").await;
    let (_local, _east) = (
        ws.helm_agent("local", &downstream_name(1)).await,
        ws.helm_agent("east", &downstream_name(2)).await,
    );
    let clusters = Api::<Cluster>::namespaced(ws.hub.clone(), &ws.ns);
    for (name, patch) in [
        ("local", json!({"metadata": {"labels": {"env": "dev"}}})),
        (
            "east",
            json!({"metadata": {"labels": {"env": "prod"}}, "spec": {"templateValues": {"policy": "Always"}}}),
        ),
    ] {
        clusters
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
    ws.source_secret("repo-auth", &[("username", "u"), ("password", "p")])
        .await;
    ws.source_secret(
        "my-top-secret-helm-access",
        &[("username", "u"), ("password", "p")],
    )
    .await;
    ws.source_secret("app-values", &[("values.yaml", "from: secret\n")])
        .await;
    let downs = [
        ws.downstream(&downstream_name(1)).await,
        ws.downstream(&downstream_name(2)).await,
    ];
    let ns = unique_name("fleet-conf");
    // Fleet's bootstrap ClusterGroup `default` selects its local cluster.
    let groups = Api::<ClusterGroup>::namespaced(ws.hub.clone(), &ws.ns);
    let group: ClusterGroup = serde_json::from_value(json!({
        "apiVersion": "tender.dev/v1alpha1", "kind": "ClusterGroup",
        "metadata": {"name": "default"},
        "spec": {"selector": {"matchLabels": {"env": "dev"}}}
    }))
    .unwrap();
    groups.create(&Default::default(), &group).await.unwrap();

    for (file, expect) in FIXTURES {
        let mut obj = fixture(file, &repo.url, &ns);
        obj["metadata"]["namespace"] = json!(ws.ns);
        let kind = obj["kind"].as_str().unwrap().to_string();
        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
        let api: Api<DynamicObject> =
            Api::namespaced_with(ws.hub.clone(), &ws.ns, &resource(&kind));
        let applied = api
            .patch(
                &name,
                &PatchParams::apply("fleet-conformance"),
                &Patch::Apply(&obj),
            )
            .await;
        match *expect {
            Expect::Refused(why) => {
                let e = applied.expect_err(file).to_string();
                assert!(e.contains(why), "{file}: {e}");
            }
            Expect::Accepted => {
                applied.unwrap_or_else(|e| panic!("{file}: {e}"));
            }
            Expect::DeploysOn {
                release,
                namespace,
                on,
            } => {
                applied.unwrap_or_else(|e| panic!("{file}: {e}"));
                let target_ns = namespace.replace(NS, &ns);
                for (c, down) in ["local", "east"].into_iter().zip(&downs) {
                    if on.contains(&c) {
                        ws.wait_applied(c, &name, file).await;
                        values_seen(down, &target_ns, release).await;
                    } else {
                        assert!(
                            ws.bds(c).get_opt(&name).await.unwrap().is_none(),
                            "{file}: {c} is not targeted"
                        );
                    }
                }
            }
            Expect::OciNormalised => {
                applied.unwrap_or_else(|e| panic!("{file}: {e}"));
                let bd = eventually(&format!("{file}: BundleDeployment"), WAIT, || async {
                    ws.bds("local").get_opt(&name).await
                })
                .await;
                let helm = bd.spec.helm.unwrap();
                assert_eq!(
                    helm.chart,
                    "oci://registry.example:5000/charts/sleeper-chart"
                );
                assert_eq!(helm.repo, None, "{file}: tender's form reaches the agent");
            }
            Expect::ConfigMap {
                namespace,
                name: cm,
                data,
            } => {
                applied.unwrap_or_else(|e| panic!("{file}: {e}"));
                let target_ns = applied_on_both(&ws, &name, file, namespace, &ns).await;
                let want: Value = serde_json::from_str(data).unwrap();
                for down in &downs {
                    let got = Api::<ConfigMap>::namespaced(down.clone(), target_ns)
                        .get(cm)
                        .await
                        .unwrap_or_else(|e| panic!("{file}: {target_ns}/{cm}: {e}"));
                    assert_eq!(serde_json::to_value(got.data).unwrap(), want, "{file}");
                }
            }
            Expect::Deploys {
                release,
                namespace,
                local,
                east,
            } => {
                applied.unwrap_or_else(|e| panic!("{file}: {e}"));
                let target_ns = applied_on_both(&ws, &name, file, namespace, &ns).await;
                for (down, want) in downs.iter().zip([local, east]) {
                    let got = values_seen(down, target_ns, release).await;
                    let want: Value = serde_json::from_str(want).unwrap();
                    assert!(contains(&got, &want), "{file}: got {got}, want {want}");
                }
            }
        }
    }

    // The chart carried in files: its pre-install hook ran with each cluster's values, and the
    // manifest file beside the chart was applied.
    for (down, cluster) in downs.iter().zip(["dev", "prod"]) {
        let cms = Api::<ConfigMap>::namespaced(down.clone(), &ns);
        let hook = cms
            .get("files-chart-hook")
            .await
            .expect("the hook's ConfigMap");
        let data = hook.data.unwrap_or_default();
        assert_eq!(data.get("cluster").map(String::as_str), Some(cluster));
        let plain = cms
            .get("files-chart-plain")
            .await
            .expect("the manifest file");
        assert_eq!(
            plain
                .data
                .unwrap_or_default()
                .get("from")
                .map(String::as_str),
            Some("a manifest file")
        );
    }
    // pollingInterval 5s: admitted, polled at the hub's floor and said so on the HelmOp.
    let helmops = Api::<HelmOp>::namespaced(ws.hub.clone(), &ws.ns);
    let raised = eventually(
        "helmop-polling-5s: PollingInterval condition",
        WAIT,
        || async {
            let h = helmops.get("helmop-polling-5s").await?;
            Ok::<_, kube::Error>(h.status.and_then(|s| {
                let c = s
                    .conditions
                    .into_iter()
                    .find(|c| c.type_ == "PollingInterval")?;
                Some((c.status, c.reason, s.version))
            }))
        },
    )
    .await;
    assert_eq!(
        raised,
        (
            "False".to_string(),
            "PollingIntervalRaised".to_string(),
            Some(VERSION.to_string())
        )
    );
    // 0s: no polling; the empty version is resolved once on the hub, as Fleet's HelmOp
    // controller resolves it, and not raised.
    let zero = eventually("helmop-polling-0: status.version", WAIT, || async {
        let h = helmops.get("helmop-polling-0").await?;
        Ok::<_, kube::Error>(h.status.filter(|s| s.version.is_some()))
    })
    .await;
    assert_eq!(zero.version.as_deref(), Some(VERSION));
    assert!(
        !zero.conditions.iter().any(|c| c.type_ == "PollingInterval"),
        "{:?}",
        zero.conditions
    );

    // The namespace-labels fixture: Fleet's labels on the namespace the agent created, the
    // target's for `local` only.
    for (down, extra) in downs.iter().zip([true, false]) {
        let n = Api::<Namespace>::all(down.clone())
            .get("ns-1")
            .await
            .unwrap();
        let labels = n.metadata.labels.unwrap_or_default();
        let annotations = n.metadata.annotations.unwrap_or_default();
        assert_eq!(labels.get("foo").map(String::as_str), Some("bar"));
        assert_eq!(annotations.get("foo").map(String::as_str), Some("bar"));
        assert_eq!(labels.contains_key("this.is/a"), extra);
        assert_eq!(annotations.contains_key("this.is/another"), extra);
    }
}
