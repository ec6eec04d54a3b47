//! `--peers flux`: a Secret and a ConfigMap pushed to N targets (namespaces spread over two
//! downstream clusters), tender in push mode beside Flux's kustomize-controller.
//!
//! - tender: N push Clusters (`spec.kubeconfigSecretRef`, one admin kubeconfig Secret per
//!   downstream cluster), ⌈N/100⌉ Bundles giving each its own namespace `app-<i>`, copying
//!   the 3 KB Secret `creds` and ConfigMap `settings` of the workspace; the hub runs in this
//!   process. Rotation: a patch of the source Secret.
//! - Flux: N Kustomizations in `flux-system`, each with `spec.kubeConfig.secretRef` (the same
//!   kubeconfigs) and `targetNamespace: flux-<i>`, all reading one `ExternalArtifact` whose
//!   tarball (the same two objects as manifests) the bench serves on loopback and whose status
//!   the bench writes, as an artifact generator would; kustomize-controller runs out-of-cluster
//!   against the hub apiserver with its default settings (4 concurrent reconciles). Rotation:
//!   a new tarball and a new revision in the ExternalArtifact status.
//!
//! Push mode is the honest comparison: like kustomize-controller, the hub itself writes into
//! every downstream cluster with a kubeconfig from a Secret; no agent runs downstream. Both
//! sides' target namespaces exist beforehand. Tender runs first, then its hub is stopped, then
//! Flux runs: they never compete for the machine.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::watcher;
use serde_json::{Value, json};
use tender_e2e::crds::{apply_crd, install_crds};
use tender_e2e::free_port;
use tender_e2e::hub_harness::{hub_config, start_hub};
use tender_e2e::{ADMIN_USER, EnvOptions, HUB, Process, TestEnv, downstream_name, peers};
use tender_types::conditions::{TYPE_CLUSTER_CONNECTED, is_true};
use tender_types::{Bundle, Cluster};

use super::artifact::{Server, digest, tar_gz};
use super::{Meter, Side, compare, idle, measure_tender, print_lines};
use crate::agents::{
    Seen, agents_bundles, cluster_name, create_namespaces, downstream_of, observe,
};
use crate::{Args, WORKSPACE, config_map, secret, wait_all};

const FLUX_NS: &str = "flux-system";
const ARTIFACT: &str = "bench";
const IN_FLIGHT: usize = 16;

/// Name of the kubeconfig Secret for downstream cluster `d` (`downstream-1` …).
fn kubeconfig_secret(d: &str) -> String {
    format!("kubeconfig-{d}")
}

/// The artifact of rotation `v`: the same Secret (its data at version `v`) and ConfigMap
/// tender copies, as manifests (JSON is YAML).
fn artifact(v: u32) -> Result<Vec<u8>> {
    let mut s = secret(v);
    s.metadata.namespace = None;
    let s = json!({"apiVersion": "v1", "kind": "Secret", "metadata": s.metadata, "data": s.data});
    let c = config_map();
    let c =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": c.metadata, "data": c.data});
    Ok(tar_gz(&[
        ("creds.yaml", serde_json::to_vec_pretty(&s)?),
        ("settings.yaml", serde_json::to_vec_pretty(&c)?),
    ]))
}

fn external_artifacts(client: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("source.toolkit.fluxcd.io", "v1", "ExternalArtifact");
    Api::namespaced_with(client.clone(), FLUX_NS, &ApiResource::from_gvk(&gvk))
}

fn kustomizations(client: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("kustomize.toolkit.fluxcd.io", "v1", "Kustomization");
    Api::namespaced_with(client.clone(), FLUX_NS, &ApiResource::from_gvk(&gvk))
}

/// Publishes rotation `v`'s tarball and writes it into the ExternalArtifact's status.
async fn publish(server: &Server, api: &Api<DynamicObject>, v: u32) -> Result<()> {
    let body = artifact(v)?;
    let (size, digest) = (body.len(), digest(&body));
    let file = format!("r{v}.tar.gz");
    let url = server.publish(&file, body);
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let revision = format!("r{v}@{digest}");
    let status = json!({"status": {
        "artifact": {"digest": digest, "lastUpdateTime": now, "path": file,
                     "revision": revision, "size": size, "url": url},
        "conditions": [{"type": "Ready", "status": "True", "reason": "Succeeded",
                        "message": format!("stored artifact for revision {revision}"),
                        "lastTransitionTime": now, "observedGeneration": 1}],
    }});
    api.patch_status(ARTIFACT, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .context("writing the ExternalArtifact status")?;
    Ok(())
}

pub async fn run(n: usize, args: &Args) -> Result<Value> {
    let timeout = Duration::from_secs(args.timeout_seconds);
    let bin = peers::ensure_flux()?;
    let env = TestEnv::start(EnvOptions {
        downstream: 2,
        state_dir: None,
    })
    .await?;
    let admin = env.client(HUB).await?;
    install_crds(&admin).await?;
    for crd in peers::flux_crds()? {
        apply_crd(&admin, &crd).await?;
    }
    create_namespaces(&admin, vec![WORKSPACE.into(), FLUX_NS.into()]).await?;
    let downs_names = [downstream_name(1), downstream_name(2)];
    let mut downs = HashMap::new();
    for d in &downs_names {
        downs.insert(d.clone(), env.client(d).await?);
        // One admin kubeconfig per downstream cluster, for both sides.
        for ns in [WORKSPACE, FLUX_NS] {
            let s = Secret {
                metadata: ObjectMeta {
                    name: Some(kubeconfig_secret(d)),
                    ..Default::default()
                },
                string_data: Some([("value".into(), env.kubeconfig_as(d, ADMIN_USER))].into()),
                ..Default::default()
            };
            Api::<Secret>::namespaced(admin.clone(), ns)
                .create(&PostParams::default(), &s)
                .await?;
        }
    }
    // Both sides' target namespaces, before anything is measured.
    for d in &downs_names {
        let names = (0..n)
            .filter(|i| downstream_of(*i) == *d)
            .flat_map(|i| [format!("app-{i:05}"), format!("flux-{i:05}")])
            .collect();
        create_namespaces(&downs[d], names).await?;
    }
    // Tender's copies land in `app-<i>`, Flux's in `flux-<i>`: one observer per cluster.
    let seen: Seen = Arc::default();
    let observers: Vec<_> = downs
        .iter()
        .map(|(d, c)| observe(c.clone(), d.clone(), "creds", seen.clone()))
        .collect();
    let mut clusters = vec![HUB.to_string()];
    clusters.extend(downs_names.iter().cloned());
    let mut meter = Meter::new(&env, &clusters).await?;
    let mut out = serde_json::Map::new();
    println!(
        "flux N={n}: {n} targets over {} downstream clusters",
        downs.len()
    );

    // ---------------------------------------------------------------- tender, push mode
    let hub = start_hub(&env, hub_config(WORKSPACE)).await?;
    let pp = PostParams::default();
    let sources: Api<Secret> = Api::namespaced(admin.clone(), WORKSPACE);
    sources.create(&pp, &secret(1)).await?;
    Api::<ConfigMap>::namespaced(admin.clone(), WORKSPACE)
        .create(&pp, &config_map())
        .await?;
    let cluster_api: Api<Cluster> = Api::namespaced(admin.clone(), WORKSPACE);
    let start = Instant::now();
    let connected = wait_all(
        "connected push Clusters",
        cluster_api.clone(),
        watcher::Config::default(),
        n,
        start,
        timeout,
        |c: &Cluster| {
            c.status
                .as_ref()
                .is_some_and(|s| is_true(&s.conditions, TYPE_CLUSTER_CONNECTED))
        },
    );
    let register = async {
        let creates = (0..n).map(|i| {
            let api = cluster_api.clone();
            async move {
                let c: Cluster = serde_json::from_value(json!({
                    "apiVersion": "tender.dev/v1alpha1", "kind": "Cluster",
                    "metadata": {"name": cluster_name(i)},
                    "spec": {"kubeconfigSecretRef": {"name": kubeconfig_secret(&downstream_of(i))}}
                }))?;
                api.create(&PostParams::default(), &c).await?;
                Ok::<(), anyhow::Error>(())
            }
        });
        let results: Vec<_> = stream::iter(creates)
            .buffer_unordered(IN_FLIGHT)
            .collect()
            .await;
        results.into_iter().collect::<Result<Vec<()>>>()?;
        Ok::<(), anyhow::Error>(())
    };
    let (secs, ()) = tokio::try_join!(connected, register)?;
    println!("  tender: {n} push Clusters connected in {secs:.1} s");
    let tender_side = Side {
        name: "tender",
        seen: &seen,
        keys: (0..n)
            .map(|i| format!("{}/app-{i:05}", downstream_of(i)))
            .collect(),
    };
    let before = meter.read().await?;
    let start = Instant::now();
    for bundle in agents_bundles(n) {
        Api::<Bundle>::namespaced(admin.clone(), WORKSPACE)
            .create(&pp, &bundle)
            .await?;
    }
    let mut tender = measure_tender(&meter, &tender_side, &sources, before, start, args).await?;
    tender.insert("mode".into(), json!("push"));
    tender.insert("connect_s".into(), json!(secs));
    let tender = Value::Object(tender);
    hub.stop().await.context("stopping the hub")?;

    // ---------------------------------------------------------------- Flux
    let server = Server::start().await?;
    let eas = external_artifacts(&admin);
    let ea: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "ExternalArtifact",
        "metadata": {"name": ARTIFACT, "namespace": FLUX_NS}, "spec": {}
    }))?;
    eas.create(&pp, &ea).await?;
    publish(&server, &eas, 1).await?;
    let hub_kubeconfig = env.state_dir().join("flux-hub.kubeconfig");
    std::fs::write(&hub_kubeconfig, env.kubeconfig_as(HUB, ADMIN_USER))?;
    let log = env.state_dir().join("kustomize-controller.log");
    let process = Process::start_with_env(
        "kustomize-controller",
        &bin,
        &[
            format!("--metrics-addr=127.0.0.1:{}", free_port()?),
            format!("--health-addr=127.0.0.1:{}", free_port()?),
            "--feature-gates=ExternalArtifact=true".into(),
            "--watch-all-namespaces=true".into(),
            "--log-level=info".into(),
        ],
        &[
            ("KUBECONFIG".into(), hub_kubeconfig.display().to_string()),
            ("RUNTIME_NAMESPACE".into(), FLUX_NS.into()),
        ],
        &log,
    )?;
    meter.add("kustomize-controller", process.pid());
    // Started when it has listed Kustomizations (its lease-less start-up is quick); give it
    // a moment so the first deployment does not include its process start.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let flux_side = Side {
        name: "flux",
        seen: &seen,
        keys: (0..n)
            .map(|i| format!("{}/flux-{i:05}", downstream_of(i)))
            .collect(),
    };
    let ks_api = kustomizations(&admin);
    let before = meter.read().await?;
    let start = Instant::now();
    let creates = (0..n).map(|i| {
        let api = ks_api.clone();
        async move {
            let ks: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
                "metadata": {"name": format!("app-{i:05}"), "namespace": FLUX_NS},
                "spec": {
                    "interval": "1h", "path": "./", "prune": true,
                    "targetNamespace": format!("flux-{i:05}"),
                    "sourceRef": {"kind": "ExternalArtifact", "name": ARTIFACT},
                    "kubeConfig": {"secretRef": {"name": kubeconfig_secret(&downstream_of(i)),
                                                 "key": "value"}},
                }
            }))?;
            api.create(&PostParams::default(), &ks).await?;
            Ok::<(), anyhow::Error>(())
        }
    });
    let results: Vec<_> = stream::iter(creates)
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<()>>>()?;
    let first = flux_side
        .first(start, timeout)
        .await
        .with_context(|| format!("Flux's first deployment (its log: {})", log.display()))?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (first_cost, lines) = meter.between(&before, &meter.read().await?);
    print_lines(&lines);
    let before = meter.read().await?;
    let rotations = flux_side
        .rotate(args.rotations, timeout, |v| {
            let (server, eas) = (&server, &eas);
            async move { publish(server, eas, v).await }
        })
        .await?;
    let (rot_cost, lines) = meter.between(&before, &meter.read().await?);
    print_lines(&lines);
    let idle_cost = idle(&meter, args.idle_seconds).await?;
    let flux = json!({"version": peers::FLUX_KUSTOMIZE_VERSION, "concurrent": 4,
        "first_s": first, "first_cost": first_cost, "rotations": rotations,
        "rotation_cost": rot_cost, "idle_cost": idle_cost});
    compare("flux", &tender, &flux);
    out.insert("tender".into(), tender);
    out.insert("flux".into(), flux);
    for o in observers {
        o.abort();
    }
    drop(process);
    drop(env);
    Ok(Value::Object(out))
}
