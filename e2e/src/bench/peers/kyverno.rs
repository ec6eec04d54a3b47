//! `--peers kyverno`: one Secret cloned into N namespaces of one cluster, tender's namespace
//! fan-out beside a Kyverno generate rule with `synchronize: true`.
//!
//! One hub-only environment. Both sides copy the same 3 KB Secret into the same N namespaces
//! `fan-<i>` (labelled `bench-fanout=true`, created beforehand), under different names so
//! they never touch each other's copies:
//!
//! - tender: the hub as its own downstream (a push Cluster `local` whose kubeconfig is the
//!   hub's own admin one) and one Bundle with `targetNamespaceSelector`, copying `creds` from
//!   the workspace; the hub runs in this process;
//! - Kyverno: its admission controller (webhooks reached over loopback, `--serverIP`) and its
//!   background controller, both out-of-cluster against the hub apiserver, and a ClusterPolicy
//!   whose generate rule clones `creds-kyverno` from the workspace into every labelled
//!   namespace (`generateExisting: true`, `synchronize: true`). Admission reports are off (the
//!   reports controller, which would aggregate them, does not run here).
//!
//! tender runs first and its hub is stopped before Kyverno starts, so Kyverno's webhooks never
//! see tender's writes and neither side competes with the other for the machine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::{StreamExt, stream};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, DynamicObject, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use tender_e2e::crds::{apply_crd, install_crds};
use tender_e2e::free_port;
use tender_e2e::hub_harness::{hub_config, start_hub};
use tender_e2e::{ADMIN_USER, EnvOptions, HUB, Process, TestEnv, peers};
use tender_types::conditions::{TYPE_CLUSTER_CONNECTED, is_true};
use tender_types::{Bundle, Cluster};

use super::{Meter, Side, compare, idle, measure_tender, print_lines};
use crate::agents::{Seen, create_namespaces, observe};
use crate::{Args, WORKSPACE, secret};

const KYVERNO_NS: &str = "kyverno";
const LABEL: &str = "bench-fanout";
const KYVERNO_COPY: &str = "creds-kyverno";
const IN_FLIGHT: usize = 16;

/// The last lines of a peer's log, for an error (the environment's directory goes with it).
fn log_tail(path: &std::path::Path) -> String {
    let text = String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(25)..].join("\n")
}

fn fan_ns(i: usize) -> String {
    format!("fan-{i:05}")
}

/// Creates the N labelled namespaces.
async fn fan_namespaces(client: &kube::Client, n: usize) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let creates = (0..n).map(|i| {
        let api = api.clone();
        async move {
            let ns: Namespace = serde_json::from_value(json!({
                "metadata": {"name": fan_ns(i), "labels": {LABEL: "true"}}
            }))?;
            api.create(&PostParams::default(), &ns).await?;
            Ok::<(), anyhow::Error>(())
        }
    });
    let results: Vec<_> = stream::iter(creates)
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(())
}

/// Kyverno's service accounts (the admission controller checks, when a generate policy is
/// created, that the background controller's account may write the generated kind), bound to
/// cluster-admin as the bench's own identity is.
async fn kyverno_identities(client: &kube::Client) -> Result<()> {
    let pp = PostParams::default();
    for sa in [
        "kyverno-admission-controller",
        "kyverno-background-controller",
        "kyverno-reports-controller",
    ] {
        let account = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(sa.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<ServiceAccount>::namespaced(client.clone(), KYVERNO_NS)
            .create(&pp, &account)
            .await?;
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": format!("bench-{sa}")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": KYVERNO_NS}]
        }))?;
        Api::<ClusterRoleBinding>::all(client.clone())
            .create(&pp, &binding)
            .await?;
    }
    Ok(())
}

/// Kyverno's configuration ConfigMap with the Helm chart's defaults that matter here: without
/// it the UpdateRequest threshold is 0 and no generate rule runs; the webhooks leave out
/// `kube-system` and Kyverno's own namespace.
async fn kyverno_config(client: &kube::Client) -> Result<()> {
    let webhooks = json!({"namespaceSelector": {"matchExpressions": [{
        "key": "kubernetes.io/metadata.name", "operator": "NotIn",
        "values": ["kube-system", KYVERNO_NS]}]}});
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "kyverno"},
        "data": {"updateRequestThreshold": "1000", "webhooks": webhooks.to_string()}
    }))?;
    Api::<ConfigMap>::namespaced(client.clone(), KYVERNO_NS)
        .create(&PostParams::default(), &cm)
        .await?;
    Ok(())
}

/// The environment both Kyverno processes need (they read their namespace, pod and account
/// names from it, as from a Deployment's downward API).
fn kyverno_env(pod: &str, account: &str) -> Vec<(String, String)> {
    [
        ("KYVERNO_NAMESPACE", KYVERNO_NS),
        ("KYVERNO_POD_NAME", pod),
        ("KYVERNO_SERVICEACCOUNT_NAME", account),
        ("KYVERNO_DEPLOYMENT", account),
        ("KYVERNO_SVC", "kyverno-svc"),
        ("INIT_CONFIG", "kyverno"),
        ("METRICS_CONFIG", "kyverno-metrics"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .to_vec()
}

fn policy() -> Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy",
        "metadata": {"name": "clone-creds"},
        "spec": {"rules": [{
            "name": "clone-creds",
            "match": {"any": [{"resources": {"kinds": ["Namespace"],
                                             "selector": {"matchLabels": {LABEL: "true"}}}}]},
            "generate": {
                "generateExisting": true, "synchronize": true,
                "apiVersion": "v1", "kind": "Secret", "name": KYVERNO_COPY,
                "namespace": "{{request.object.metadata.name}}",
                "clone": {"namespace": WORKSPACE, "name": KYVERNO_COPY},
            },
        }]}
    }))?)
}

pub async fn run(n: usize, args: &Args) -> Result<Value> {
    let timeout = Duration::from_secs(args.timeout_seconds);
    let (admission_bin, background_bin) = peers::ensure_kyverno()?;
    let env = TestEnv::start(EnvOptions {
        downstream: 0,
        state_dir: None,
    })
    .await?;
    let admin = env.client(HUB).await?;
    install_crds(&admin).await?;
    for crd in peers::kyverno_crds()? {
        apply_crd(&admin, &crd).await?;
    }
    create_namespaces(&admin, vec![WORKSPACE.into(), KYVERNO_NS.into()]).await?;
    kyverno_identities(&admin).await?;
    kyverno_config(&admin).await?;
    fan_namespaces(&admin, n).await?;
    let seen: Seen = Arc::default();
    let observers = [
        observe(admin.clone(), "tender".into(), "creds", seen.clone()),
        observe(admin.clone(), "kyverno".into(), KYVERNO_COPY, seen.clone()),
    ];
    let mut meter = Meter::new(&env, &[HUB.to_string()]).await?;
    let mut out = serde_json::Map::new();
    println!("kyverno N={n}: one Secret into {n} namespaces of one cluster");

    // ---------------------------------------------------------------- tender
    let hub = start_hub(&env, hub_config(WORKSPACE)).await?;
    let pp = PostParams::default();
    let sources: Api<Secret> = Api::namespaced(admin.clone(), WORKSPACE);
    sources.create(&pp, &secret(1)).await?;
    let kubeconfig = Secret {
        metadata: ObjectMeta {
            name: Some("kubeconfig-hub".into()),
            ..Default::default()
        },
        string_data: Some([("value".into(), env.kubeconfig_as(HUB, ADMIN_USER))].into()),
        ..Default::default()
    };
    sources.create(&pp, &kubeconfig).await?;
    let local: Cluster = serde_json::from_value(json!({
        "apiVersion": "tender.dev/v1alpha1", "kind": "Cluster",
        "metadata": {"name": "local"},
        "spec": {"kubeconfigSecretRef": {"name": "kubeconfig-hub"}}
    }))?;
    let clusters: Api<Cluster> = Api::namespaced(admin.clone(), WORKSPACE);
    clusters.create(&pp, &local).await?;
    let deadline = Instant::now() + timeout;
    loop {
        let c = clusters.get("local").await?;
        if c.status
            .is_some_and(|s| is_true(&s.conditions, TYPE_CLUSTER_CONNECTED))
        {
            break;
        }
        if Instant::now() > deadline {
            bail!("the push Cluster `local` did not connect in {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The observers key each side's copies by the side's name.
    let keys = |side: &str| (0..n).map(|i| format!("{side}/{}", fan_ns(i))).collect();
    let tender_side = Side {
        name: "tender",
        seen: &seen,
        keys: keys("tender"),
    };
    let bundle: Bundle = serde_json::from_value(json!({
        "apiVersion": "tender.dev/v1alpha1", "kind": "Bundle",
        "metadata": {"name": "fanout", "namespace": WORKSPACE},
        "spec": {
            "targets": [{"clusterName": "local"}],
            "targetNamespaceSelector": {"matchLabels": {LABEL: "true"}},
            "downstreamResources": [{"kind": "Secret", "name": "creds"}],
        }
    }))?;
    let before = meter.read().await?;
    let start = Instant::now();
    Api::<Bundle>::namespaced(admin.clone(), WORKSPACE)
        .create(&pp, &bundle)
        .await?;
    let mut tender = measure_tender(&meter, &tender_side, &sources, before, start, args).await?;
    tender.insert(
        "mode".into(),
        json!("push to the hub itself, targetNamespaceSelector"),
    );
    let tender = Value::Object(tender);
    hub.stop().await.context("stopping the hub")?;

    // ---------------------------------------------------------------- Kyverno
    let mut source = secret(1);
    source.metadata.name = Some(KYVERNO_COPY.into());
    sources.create(&pp, &source).await?;
    let kubeconfig = env.state_dir().join("kyverno-hub.kubeconfig");
    std::fs::write(&kubeconfig, env.kubeconfig_as(HUB, ADMIN_USER))?;
    let webhook_port = free_port()?;
    let admission_log = env.state_dir().join("kyverno-admission.log");
    let admission = Process::start_with_env(
        "kyverno-admission-controller",
        &admission_bin,
        &[
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--serverIP=127.0.0.1:{webhook_port}"),
            "--webhookServerHost=127.0.0.1".into(),
            format!("--webhookServerPort={webhook_port}"),
            "--caSecretName=kyverno-svc.kyverno.svc.kyverno-tls-ca".into(),
            "--tlsSecretName=kyverno-svc.kyverno.svc.kyverno-tls-pair".into(),
            "--backgroundServiceAccountName=system:serviceaccount:kyverno:kyverno-background-controller".into(),
            "--reportsServiceAccountName=system:serviceaccount:kyverno:kyverno-reports-controller".into(),
            "--admissionReports=false".into(),
            "--metricsHost=127.0.0.1".into(),
            format!("--metricsPort={}", free_port()?),
            format!("--controllerRuntimeMetricsAddress=127.0.0.1:{}", free_port()?),
            "--autoMemLimitEnabled=false".into(),
            // Kyverno gives up leadership, and exits, when a Lease renewal takes more than
            // 10 s (the default 2 s retry period), which a loaded 2-core machine sees; in a
            // pod the kubelet would restart it, here nothing would.
            "--leaderElectionRetryPeriod=10s".into(),
            "--disableLogColor=true".into(),
        ],
        &kyverno_env("kyverno-admission-bench", "kyverno-admission-controller"),
        &admission_log,
    )?;
    meter.add("kyverno admission", admission.pid());
    let background_log = env.state_dir().join("kyverno-background.log");
    let background = Process::start_with_env(
        "kyverno-background-controller",
        &background_bin,
        &[
            format!("--kubeconfig={}", kubeconfig.display()),
            "--metricsHost=127.0.0.1".into(),
            format!("--metricsPort={}", free_port()?),
            format!(
                "--controllerRuntimeMetricsAddress=127.0.0.1:{}",
                free_port()?
            ),
            "--autoMemLimitEnabled=false".into(),
            // Kyverno gives up leadership, and exits, when a Lease renewal takes more than
            // 10 s (the default 2 s retry period), which a loaded 2-core machine sees; in a
            // pod the kubelet would restart it, here nothing would.
            "--leaderElectionRetryPeriod=10s".into(),
            "--disableLogColor=true".into(),
        ],
        &kyverno_env("kyverno-background-bench", "kyverno-background-controller"),
        &background_log,
    )?;
    meter.add("kyverno background", background.pid());
    // Ready when the admission controller has registered its resource webhook (created by
    // its leader once its certificates exist), which it needs before any policy.
    let hooks: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
    let started = Instant::now();
    let deadline = started + timeout.min(Duration::from_secs(300));
    loop {
        let names: Vec<String> = hooks
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter_map(|h| h.metadata.name)
            .collect();
        if names
            .iter()
            .any(|n| n.starts_with("kyverno-policy-mutating"))
        {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "Kyverno registered no webhooks in {:?} (webhook configurations: {names:?}); admission controller's log:\n{}",
                started.elapsed(),
                log_tail(&admission_log),
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "  kyverno: controllers up, webhooks registered after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let kyverno_side = Side {
        name: "kyverno",
        seen: &seen,
        keys: keys("kyverno"),
    };
    let gvk = GroupVersionKind::gvk("kyverno.io", "v1", "ClusterPolicy");
    let policies: Api<DynamicObject> = Api::all_with(admin.clone(), &ApiResource::from_gvk(&gvk));
    let before = meter.read().await?;
    let start = Instant::now();
    policies
        .create(&pp, &policy()?)
        .await
        .context("creating the ClusterPolicy")?;
    let first = kyverno_side.first(start, timeout).await.with_context(|| {
        format!(
            "Kyverno's first fan-out; admission controller's log:\n{}\nbackground controller's log:\n{}",
            log_tail(&admission_log),
            log_tail(&background_log)
        )
    })?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (first_cost, lines) = meter.between(&before, &meter.read().await?);
    print_lines(&lines);
    let before = meter.read().await?;
    let rotations = kyverno_side
        .rotate(args.rotations, timeout, |v| {
            let sources = sources.clone();
            async move {
                let patch = Patch::Merge(json!({"data": secret(v).data}));
                sources
                    .patch(KYVERNO_COPY, &PatchParams::default(), &patch)
                    .await?;
                Ok(())
            }
        })
        .await?;
    let (rot_cost, lines) = meter.between(&before, &meter.read().await?);
    print_lines(&lines);
    let idle_cost = idle(&meter, args.idle_seconds).await?;
    let kyverno = json!({"version": peers::KYVERNO_PEER_VERSION, "first_s": first,
        "first_cost": first_cost, "rotations": rotations, "rotation_cost": rot_cost, "idle_cost": idle_cost});
    compare("kyverno", &tender, &kyverno);
    out.insert("tender".into(), tender);
    out.insert("kyverno".into(), kyverno);
    for o in observers {
        o.abort();
    }
    drop((admission, background));
    drop(env);
    Ok(Value::Object(out))
}
