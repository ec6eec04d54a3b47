//! Issue 39: `tender apply` (the real binary) converts fleet.yaml directories of Fleet's own
//! repositories (e2e/fixtures/fleet-repos, unchanged) and applies them to a real hub with two
//! real agents (`local` env=dev, `east` env=prod, a `default` ClusterGroup selecting both):
//! the objects each cluster gets, with the fields Fleet would give it, each BundleDeployment
//! applied at its deploymentID; and a refusal that writes nothing. Deployments never become
//! available here (no kubelet): the objects and their fields are checked. Without a cluster:
//! each environment's Bundle carries exactly what fleet-examples' own expected output
//! (`tests/expected/<dir>/<env>-output.yaml`) lists — plain manifests, overlays, kustomize
//! (built from kustomize's library, `ensure_kustomize`), and local charts rendered by the
//! pinned `helm template` with that environment's values.
//!
//! The directories carrying a chart as files (multi-cluster/helm, helm-cluster-values,
//! simple-chart) need Bundle file entries rendered by the agent (branch `files`, decision
//! 0123); until then their test is ignored.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tender_e2e::fixture::{WAIT, Workspace};
use tender_e2e::{HUB, downstream_name, ensure_kustomize, eventually, shared_env};
use tender_types::{Bundle, Cluster, ClusterGroup};

/// The `tender` binary (built with the hub and agent, once per test process).
fn tender_bin() -> PathBuf {
    tender_e2e::binaries::tender_binaries()
        .expect("building tender")
        .cli
        .clone()
}

fn repos() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fleet-repos")
}

/// Runs `tender apply DIRS -n <workspace>` in the fixtures directory, as a user in a checkout.
async fn tender_apply(ws: &Workspace, dirs: &[&str]) -> Output {
    let kubeconfig = ws.env.cluster(HUB).kubeconfig.clone();
    let kustomize = ensure_kustomize().expect("building kustomize");
    let ns = ws.ns.clone();
    let dirs: Vec<String> = dirs.iter().map(|d| d.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        Command::new(tender_bin())
            .current_dir(repos())
            .arg("apply")
            .args(&dirs)
            .args(["-n", &ns])
            .arg("--hub-kubeconfig")
            .arg(&kubeconfig)
            .arg("--kustomize")
            .arg(&kustomize)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// Two clusters (`local` env=dev, `east` env=prod; east's templateValues policy=Always) and
/// the `default` ClusterGroup selecting both, as Fleet's GitRepo targets by default.
async fn workspace() -> (Workspace, [tender_e2e::fixture::Agent; 2]) {
    let ws = Workspace::new(shared_env(2).await, "fleet-apply").await;
    let agents = [
        ws.helm_agent("local", &downstream_name(1)).await,
        ws.helm_agent("east", &downstream_name(2)).await,
    ];
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
    let group: ClusterGroup =
        serde_json::from_value(json!({"metadata": {"name": "default"}, "spec": {"selector": {}}}))
            .unwrap();
    Api::<ClusterGroup>::namespaced(ws.hub.clone(), &ws.ns)
        .create(&PostParams::default(), &group)
        .await
        .unwrap();
    (ws, agents)
}

/// The Bundles `tender apply` reported applying, from its output lines.
fn applied(out: &Output, ns: &str) -> Vec<String> {
    assert!(
        out.status.success(),
        "tender apply failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            l.strip_prefix(&format!("Bundle {ns}/"))
                .and_then(|l| l.strip_suffix(" applied"))
                .unwrap_or_else(|| panic!("unexpected line {l:?}"))
                .to_string()
        })
        .collect()
}

async fn replicas(down: &kube::Client, ns: &str, name: &str) -> Option<i32> {
    let api = Api::<Deployment>::namespaced(down.clone(), ns);
    let d = eventually(&format!("Deployment {ns}/{name}"), WAIT, || async {
        api.get_opt(name).await
    })
    .await;
    d.spec.and_then(|s| s.replicas)
}

async fn service_type(down: &kube::Client, ns: &str, name: &str) -> String {
    let api = Api::<Service>::namespaced(down.clone(), ns);
    let s = eventually(&format!("Service {ns}/{name}"), WAIT, || async {
        api.get_opt(name).await
    })
    .await;
    s.spec.and_then(|s| s.type_).unwrap_or_default()
}

async fn absent<K>(api: &Api<K>, name: &str) -> bool
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name).await.unwrap().is_none()
}

/// `tender apply -o json DIR` with the test kustomize: the Bundles.
fn printed(dir: &str) -> Vec<Value> {
    let out = Command::new(tender_bin())
        .current_dir(repos())
        .args(["apply", dir, "-o", "json", "--kustomize"])
        .arg(ensure_kustomize().expect("building kustomize"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// An object as Fleet's expected output shows it, without what Fleet's apply adds (its
/// objectset label and annotation, the namespace) — or one of ours as it is.
fn comparable(mut o: Value) -> Value {
    let meta = o["metadata"].as_object_mut().unwrap();
    meta.remove("namespace");
    for (key, fleets) in [
        ("labels", "objectset.rio.cattle.io/hash"),
        ("annotations", "objectset.rio.cattle.io/id"),
    ] {
        if let Some(Value::Object(m)) = meta.get_mut(key) {
            m.remove(fleets);
            if m.is_empty() {
                meta.remove(key);
            }
        }
    }
    o
}

/// The Bundle a cluster labelled env=`env` gets (its first selecting target deploys) and
/// that target.
fn bundle_for<'a>(bundles: &'a [Value], env: &str) -> (&'a Value, &'a Value) {
    let selects = |t: &Value| {
        t["clusterSelector"]["matchLabels"]["env"] == env || t["clusterGroup"] == "default"
    };
    bundles
        .iter()
        .find_map(|b| {
            let t = b["spec"]["targets"]
                .as_array()?
                .iter()
                .find(|t| selects(t))?;
            t.get("doNotDeploy").is_none().then_some((b, t))
        })
        .unwrap_or_else(|| panic!("no Bundle for env={env}"))
}

/// fleet-examples' expected output of `dir` for `env` (`tests/expected/<dir>/<env>-output.yaml`).
fn fleets_output(dir: &str, env: &str) -> Vec<Value> {
    let path = repos().join(format!(
        "fleet-examples/tests/expected/{dir}/{env}-output.yaml"
    ));
    let text = std::fs::read_to_string(&path).unwrap();
    objects(&text)
}

fn objects(text: &str) -> Vec<Value> {
    let mut out: Vec<Value> = serde_saphyr::from_multiple::<Option<Value>>(text)
        .unwrap()
        .into_iter()
        .flatten()
        .map(comparable)
        .collect();
    out.sort_by_key(|o| format!("{}/{}", o["kind"], o["metadata"]["name"]));
    out
}

/// Fleet's expected output of fleet-examples is what the variant of a cluster labelled
/// env=<env> carries: the same objects, field for field.
#[test]
fn each_environment_gets_the_objects_fleet_s_own_expected_output_lists() {
    for dir in [
        "multi-cluster/manifests",
        "multi-cluster/kustomize",
        "single-cluster/manifests",
        "single-cluster/kustomize",
    ] {
        let bundles = printed(&format!("fleet-examples/{dir}"));
        for env in ["dev", "test", "prod"] {
            let (bundle, _) = bundle_for(&bundles, env);
            let mut ours: Vec<Value> = bundle["spec"]["resources"]
                .as_array()
                .unwrap()
                .iter()
                .cloned()
                .map(comparable)
                .collect();
            ours.sort_by_key(|o| format!("{}/{}", o["kind"], o["metadata"]["name"]));
            assert_eq!(ours, fleets_output(dir, env), "{dir} for env={env}");
        }
    }
}

/// A local chart: its files from the Bundle and the values a cluster of each environment
/// gets (the Bundle's, then its target's, merged as the agent merges them), rendered by the
/// pinned `helm template`, give fleet-examples' expected output for that environment.
#[test]
fn a_local_chart_with_each_environment_s_values_renders_fleet_s_expected_output() {
    let helm = tender_e2e::ensure_helm().expect("building helm");
    for dir in ["multi-cluster/helm", "single-cluster/helm"] {
        let bundles = printed(&format!("fleet-examples/{dir}"));
        for env in ["dev", "test", "prod"] {
            let (bundle, target) = bundle_for(&bundles, env);
            let work = std::env::temp_dir().join(tender_e2e::unique_name("fleet-apply-chart"));
            for f in bundle["spec"]["resources"].as_array().unwrap() {
                assert!(f.get("encoding").is_none(), "{f}");
                let path = work.join("files").join(f["name"].as_str().unwrap());
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(path, f["content"].as_str().unwrap()).unwrap();
            }
            let values = |v: &Value| if v.is_null() { json!({}) } else { v.clone() };
            let spec_values = work.join("spec-values.json");
            let target_values = work.join("target-values.json");
            let spec = values(&bundle["spec"]["helm"]["values"]);
            std::fs::write(&spec_values, spec.to_string()).unwrap();
            std::fs::write(
                &target_values,
                values(&target["helm"]["values"]).to_string(),
            )
            .unwrap();
            let chart = work
                .join("files")
                .join(bundle["spec"]["helm"]["chart"].as_str().unwrap_or(""));
            let out = Command::new(&helm)
                .args(["template", "release"])
                .arg(&chart)
                .arg("-f")
                .arg(&spec_values)
                .arg("-f")
                .arg(&target_values)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let _ = std::fs::remove_dir_all(&work);
            assert_eq!(
                objects(&String::from_utf8(out.stdout).unwrap()),
                fleets_output(dir, env),
                "{dir} for env={env}"
            );
        }
    }
}

#[tokio::test]
async fn fleet_examples_manifests_and_kustomize_deploy_per_cluster_variants() {
    let (ws, _agents) = workspace().await;
    let downs = [
        ws.downstream(&downstream_name(1)).await,
        ws.downstream(&downstream_name(2)).await,
    ];
    let out = tender_apply(
        &ws,
        &[
            "fleet-examples/multi-cluster/manifests",
            "fleet-examples/multi-cluster/kustomize",
            "fleet-examples/single-cluster/manifests",
        ],
    )
    .await;
    let bundles = applied(&out, &ws.ns);
    assert_eq!(
        bundles,
        [
            "fleet-examples-multi-cluster-manifests-dev",
            "fleet-examples-multi-cluster-manifests-test",
            "fleet-examples-multi-cluster-manifests-prod",
            "fleet-examples-multi-cluster-kustomize-dev",
            "fleet-examples-multi-cluster-kustomize-test",
            "fleet-examples-multi-cluster-kustomize-prod",
            "fleet-examples-single-cluster-manifests",
        ]
    );
    // Each cluster gets exactly one variant: dev on local, prod on east, test on neither.
    for (cluster, variant) in [("local", "dev"), ("east", "prod")] {
        for dir in ["manifests", "kustomize"] {
            ws.wait_applied(
                cluster,
                &format!("fleet-examples-multi-cluster-{dir}-{variant}"),
                "tender apply",
            )
            .await;
        }
        ws.wait_applied(
            cluster,
            "fleet-examples-single-cluster-manifests",
            "tender apply",
        )
        .await;
    }
    for (cluster, variant) in [("local", "dev"), ("east", "prod")] {
        for b in &bundles {
            let expected = b.ends_with(&format!("-{variant}")) || b.contains("single-cluster");
            let bd = ws.bds(cluster).get_opt(b).await.unwrap();
            assert_eq!(bd.is_some(), expected, "{b} on {cluster}");
        }
    }
    // dev (local): yaml overlay `noreplication` (redis-slave's Deployment replaced by an empty
    // file, its Service patched); kustomize overlays/dev (redis-slave scaled to 0). prod
    // (east): servicelb + scale3 (overlays and kustomize alike).
    let [local, east] = &downs;
    let manifests = "fleet-mc-manifest-example";
    assert_eq!(
        replicas(local, "fleet-mc-kustomize-example", "redis-slave").await,
        Some(0)
    );
    for ns in [manifests, "fleet-mc-kustomize-example"] {
        assert_eq!(replicas(local, ns, "frontend").await, Some(1), "{ns}");
        assert_eq!(replicas(east, ns, "frontend").await, Some(3), "{ns}");
        assert_eq!(replicas(east, ns, "redis-slave").await, Some(2), "{ns}");
        assert_eq!(
            service_type(east, ns, "frontend").await,
            "LoadBalancer",
            "{ns}"
        );
        assert_ne!(
            service_type(local, ns, "frontend").await,
            "LoadBalancer",
            "{ns}"
        );
    }
    assert!(
        absent(
            &Api::<Deployment>::namespaced(local.clone(), manifests),
            "redis-slave"
        )
        .await
    );
    let svc = Api::<Service>::namespaced(local.clone(), manifests);
    let slave = eventually("redis-slave Service", WAIT, || async {
        svc.get_opt("redis-slave").await
    })
    .await;
    assert_eq!(
        slave.spec.unwrap().selector.unwrap()["role"],
        "master",
        "the noreplication overlay's _patch file patched the Service"
    );
    for down in &downs {
        assert_eq!(
            replicas(down, "fleet-manifest-example", "redis-slave").await,
            Some(2)
        );
    }
}

#[tokio::test]
async fn a_refusal_writes_no_bundle_and_names_every_field() {
    let (ws, _agents) = workspace().await;
    let out = tender_apply(
        &ws,
        &[
            "fleet-test-data/simple",
            "fleet-test-data/imagescans",
            "fleet-examples/multi-cluster/helm-kustomize",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for path in [
        "fleet-test-data/imagescans: imageScans:",
        "fleet-examples/multi-cluster/helm-kustomize: targetCustomizations[0].kustomize.dir:",
        "fleet-examples/multi-cluster/helm-kustomize: targetCustomizations[2].kustomize.dir:",
    ] {
        assert!(err.contains(path), "{path} not in:\n{err}");
    }
    let bundles = Api::<Bundle>::namespaced(ws.hub.clone(), &ws.ns);
    assert!(
        absent(&bundles, "fleet-test-data-simple").await,
        "nothing applied"
    );
    assert!(
        bundles
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    // --dry-run: admitted by the apiserver, not stored.
    let out = tender_apply(&ws, &["fleet-test-data/simple", "--dry-run"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!(
            "Bundle {}/fleet-test-data-simple applied (server dry run)",
            ws.ns
        )
    );
    assert!(
        absent(&bundles, "fleet-test-data-simple").await,
        "dry run stored nothing"
    );
}

#[tokio::test]
async fn local_charts_deploy_with_per_cluster_values() {
    let (ws, _agents) = workspace().await;
    let downs = [
        ws.downstream(&downstream_name(1)).await,
        ws.downstream(&downstream_name(2)).await,
    ];
    let out = tender_apply(
        &ws,
        &[
            "fleet-examples/multi-cluster/helm",
            "fleet-test-data/helm-cluster-values",
            "fleet-test-data/simple-chart",
        ],
    )
    .await;
    let bundles = applied(&out, &ws.ns);
    for b in &bundles {
        for cluster in ["local", "east"] {
            ws.wait_applied(cluster, b, b).await;
        }
    }
    let [local, east] = &downs;
    // multi-cluster/helm: dev `replication: false` (no redis-slave), prod replicas 3 and a
    // LoadBalancer.
    let ns = "fleet-mc-helm-example";
    assert_eq!(replicas(east, ns, "frontend").await, Some(3));
    assert_eq!(service_type(east, ns, "frontend").await, "LoadBalancer");
    assert_eq!(replicas(local, ns, "frontend").await, Some(1));
    assert!(
        absent(
            &Api::<Deployment>::namespaced(local.clone(), ns),
            "redis-slave"
        )
        .await
    );
    // helm-cluster-values: Fleet's ${ } templating per cluster.
    for (down, cluster, policy) in [(local, "local", "IfNotPresent"), (east, "east", "Always")] {
        let cms = Api::<ConfigMap>::namespaced(down.clone(), "default");
        let cm = eventually("test-template-values", WAIT, || async {
            cms.get_opt("test-template-values").await
        })
        .await;
        let data = cm.data.unwrap();
        assert_eq!(data["name"], format!("name-{cluster}"));
        assert_eq!(data["imagePullPolicy"], policy);
        // simple-chart: values from the fleet.yaml.
        let cm = eventually("test-simple-chart-config", WAIT, || async {
            cms.get_opt("test-simple-chart-config").await
        })
        .await;
        assert_eq!(cm.data.unwrap()["name"], "example-value");
    }
}

/// Every fixture directory `tender-fleet` converts (`crates/fleet/tests/fixtures.expected`)
/// gives Bundles the real apiserver admits: one `tender apply --dry-run` over all of them.
#[tokio::test]
async fn every_converted_directory_is_admitted_by_the_apiserver() {
    let expected = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/fleet/tests/fixtures.expected"),
    )
    .unwrap();
    let mut dirs: Vec<&str> = Vec::new();
    let mut current = None;
    for line in expected.lines() {
        if !line.starts_with(' ') && !line.is_empty() {
            current = Some(line.trim());
        } else if line.trim_start().starts_with("bundle ")
            && let Some(dir) = current.take()
        {
            dirs.push(dir);
        }
    }
    assert!(dirs.len() >= 40, "{dirs:?}");
    let ws = Workspace::without_hub(shared_env(2).await, "fleet-apply-all").await;
    let mut args = dirs.clone();
    args.push("--dry-run");
    let out = tender_apply(&ws, &args).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let admitted = stdout
        .lines()
        .filter(|l| l.ends_with("applied (server dry run)"))
        .count();
    let bundles = expected
        .lines()
        .filter(|l| l.trim_start().starts_with("bundle "))
        .count();
    assert_eq!(admitted, bundles, "{stdout}");
}
