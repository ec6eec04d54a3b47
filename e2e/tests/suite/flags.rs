//! Every documented flag and chart value of `tender-hub` and `tender-agent`, and the
//! `EXPERIMENTAL_COPY_RESOURCES_DOWNSTREAM` gate, take effect in the binaries (issue 14): each
//! binary runs as a process from its chart's rendered Deployment ([`tender_e2e::running`]),
//! two side by side — the chart's defaults and every value changed — with one observable check
//! per flag. The flags that cannot be observed cheaply are listed with the reason in
//! docs/reliability.md ("Faults on real processes").

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tender_e2e::fixture::{Workspace, create_namespace};
use tender_e2e::running::{
    AgentOpts, OwnEnv, Running, apply_hub_chart, install_hub_chart, start_agent,
};
use tender_e2e::{HUB, TestEnv, downstream_name, eventually, unique_name};
use tender_types::{Cluster, labels, names};

/// How long a check waits for its condition.
const CONVERGE: Duration = Duration::from_secs(120);

// Each test starts its own environment (and restarts only its own components); the binaries
// they run get kernel-chosen ports: the tests run side by side (issue 38 item 3).

/// The reason of condition `type_` on the object `value` (a Bundle, Cluster or
/// BundleDeployment as JSON), if set.
fn reason_of(value: &Value, type_: &str) -> Option<String> {
    value
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .and_then(|c| c["reason"].as_str())
        .map(str::to_string)
}

/// Waits until condition `type_` of the object `get` reads has reason `reason`; returns the
/// object.
async fn wait_reason<K, F, Fut>(what: &str, type_: &str, reason: &str, get: F) -> Value
where
    K: serde::Serialize,
    F: Fn() -> Fut,
    Fut: Future<Output = kube::Result<K>>,
{
    eventually(&format!("{what}: {type_} {reason}"), CONVERGE, || async {
        let v = serde_json::to_value(get().await?).unwrap();
        Ok::<_, kube::Error>((reason_of(&v, type_).as_deref() == Some(reason)).then_some(v))
    })
    .await
}

/// Log lines: all JSON, or none; whether any is at debug level.
fn log_shape(log: &str) -> (bool, bool, bool) {
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    // An empty log is neither: a check of the format must see lines to pass.
    let json = !lines.is_empty() && lines.iter().all(|l| l.starts_with('{'));
    let text = !lines.is_empty() && lines.iter().all(|l| !l.starts_with('{'));
    let debug = lines.iter().any(|l| l.contains("DEBUG"));
    (json, text, debug)
}

/// A push kubeconfig for `cluster` whose credential is an exec plugin: a script printing the
/// admin token as an ExecCredential.
fn exec_kubeconfig(env: &TestEnv, cluster: &str) -> String {
    let script = env.state_dir().join(unique_name("exec-credential"));
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nprintf '%s' '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\
             \"kind\":\"ExecCredential\",\"status\":{{\"token\":\"{}\"}}}}'\n",
            env.token(tender_e2e::ADMIN_USER)
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    env.kubeconfig_as(cluster, tender_e2e::ADMIN_USER)
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("token:") {
                format!(
                    "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      \
                     command: {}\n      interactiveMode: Never",
                    script.display()
                )
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Push Cluster `name` in `ws` with `kubeconfig` in Secret `<name>-kubeconfig`.
async fn push_cluster(ws: &Workspace, name: &str, kubeconfig: &str) {
    let secret = format!("{name}-kubeconfig");
    Api::<Secret>::namespaced(ws.hub.clone(), &ws.ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": secret}, "stringData": {"value": kubeconfig}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    ws.cluster_with_spec(name, json!({"kubeconfigSecretRef": {"name": secret}}))
        .await;
}

/// An agent heartbeat written by hand (the Lease an agent renews), `renew` seconds ago.
async fn heartbeat(ws: &Workspace, cluster: &str) {
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": names::AGENT_LEASE},
        "spec": {"holderIdentity": "by-hand", "leaseDurationSeconds": 90,
                 "renewTime": k8s_openapi::jiff::Timestamp::now().to_string()}
    }))
    .unwrap();
    Api::<Lease>::namespaced(ws.hub.clone(), &ws.cluster_ns(cluster))
        .patch(
            names::AGENT_LEASE,
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&lease),
        )
        .await
        .unwrap();
}

fn copy_bundle(cluster: &str) -> Value {
    json!({
        "targets": [{"clusterName": cluster}],
        "defaultNamespace": "apps",
        "downstreamResources": [
            {"kind": "Secret", "name": "db-creds"},
            {"kind": "ConfigMap", "name": "app-config"}
        ],
    })
}

#[tokio::test]
async fn every_hub_flag_and_chart_value_takes_effect_in_the_binary() {
    let env = OwnEnv::start(1).await;
    // Hub A: the chart's defaults but one copyable kind. Hub B: every other value changed.
    let a_ws = Workspace::without_hub(env.0, "flags-a").await;
    let b_ws = Workspace::without_hub(env.0, "flags-b").await;
    let unserved = Workspace::without_hub(env.0, "flags-unserved").await;
    let release_ns = unique_name("tender-system");
    create_namespace(&a_ws.hub, &release_ns).await;
    let a_deployment = apply_hub_chart(
        &a_ws.hub,
        &release_ns,
        &a_ws.ns,
        &["copyableKinds={v1/Secret}"],
    )
    .await;
    let b_deployment = apply_hub_chart(
        &b_ws.hub,
        &release_ns,
        &b_ws.ns,
        &[
            "copyResourcesDownstream=false",
            "push.allowKubeconfigExec=true",
            "push.probeSeconds=1",
            "logFormat=text",
            "logLevel=debug",
            "leaderElection.leaseName=flags-lease",
            "clusterSummaryDelaySeconds=0",
            // Parsed by the binary (a value it refused would stop it); its effect is
            // e2e/tests/cluster_status.rs.
            "clusterRolloutSummaryDelaySeconds=7",
            // Parsed by the binary; its effect is e2e/tests/hostile_hub_tenants.rs.
            "maxCopiedBytesPerBundle=1048576",
        ],
    )
    .await;
    let mut a = Running::start(env.0, HUB, &a_deployment, "tender-hub-a", &[]).await;
    let mut b = Running::start(
        env.0,
        HUB,
        &b_deployment,
        "tender-hub-b",
        &[("--agent-offline-after-seconds", "4")],
    )
    .await;

    // --leader-election, --lease-namespace (POD_NAMESPACE), --lease-name, --pod-name (POD_NAME).
    let leases: Api<Lease> = Api::namespaced(a_ws.hub.clone(), &release_ns);
    for (lease, holder) in [
        ("tender-hub", "tender-hub-a"),
        ("flags-lease", "tender-hub-b"),
    ] {
        eventually(
            &format!("Lease {lease} held by {holder}"),
            CONVERGE,
            || async {
                let l = leases.get_opt(lease).await?;
                let h = l.and_then(|l| l.spec).and_then(|s| s.holder_identity);
                Ok::<_, kube::Error>((h.as_deref() == Some(holder)).then_some(()))
            },
        )
        .await;
    }

    // --workspace-namespace: each serves its own workspace only.
    for ws in [&a_ws, &b_ws] {
        ws.source_secret("db-creds", &[("password", "v1")]).await;
        ws.source_config_map("app-config", &[("mode", "blue")])
            .await;
        ws.cluster("c").await;
    }
    let stray: Cluster = serde_json::from_value(json!({
        "apiVersion": "tender.dev/v1alpha1", "kind": "Cluster",
        "metadata": {"name": "c"}, "spec": {}
    }))
    .unwrap();
    let unserved_clusters: Api<Cluster> = Api::namespaced(unserved.hub.clone(), &unserved.ns);
    unserved_clusters
        .create(&PostParams::default(), &stray)
        .await
        .unwrap();

    // --copyable-kinds (copyableKinds) on A; EXPERIMENTAL_COPY_RESOURCES_DOWNSTREAM
    // (copyResourcesDownstream) off on B.
    for ws in [&a_ws, &b_ws] {
        ws.bundle("app", copy_bundle("c")).await;
    }
    let bundle = |ws: &Workspace| Api::<tender_types::Bundle>::namespaced(ws.hub.clone(), &ws.ns);
    let a_bundles = bundle(&a_ws);
    wait_reason("A's Bundle", "ResourcesCopied", "KindNotAllowed", || {
        a_bundles.get("app")
    })
    .await;
    let b_bundles = bundle(&b_ws);
    wait_reason(
        "B's Bundle",
        "ResourcesCopied",
        "CopyFeatureDisabled",
        || b_bundles.get("app"),
    )
    .await;

    // --allow-kubeconfig-exec (push.allowKubeconfigExec): refused by A, used by B.
    let kubeconfig = exec_kubeconfig(env.0, &downstream_name(1));
    for ws in [&a_ws, &b_ws] {
        push_cluster(ws, "p", &kubeconfig).await;
    }
    let clusters = |ws: &Workspace| Api::<Cluster>::namespaced(ws.hub.clone(), &ws.ns);
    let a_clusters = clusters(&a_ws);
    let b_clusters = clusters(&b_ws);
    wait_reason(
        "A's push Cluster",
        "ClusterConnected",
        "KubeconfigExecNotAllowed",
        || a_clusters.get("p"),
    )
    .await;
    wait_reason(
        "B's push Cluster",
        "ClusterConnected",
        "ClusterConnected",
        || b_clusters.get("p"),
    )
    .await;

    // --push-probe-seconds (push.probeSeconds=1): B sees its push cluster go away well within
    // the default 30 s interval.
    let apiserver = format!("{}/kube-apiserver", downstream_name(1));
    let stopped = Instant::now();
    env.0.stop_component(&apiserver);
    wait_reason(
        "B's push Cluster",
        "ClusterConnected",
        "ClusterUnreachable",
        || b_clusters.get("p"),
    )
    .await;
    let noticed = stopped.elapsed();
    env.0.start_component(&apiserver).await.unwrap();
    assert!(
        noticed < Duration::from_secs(30),
        "a 1 s probe noticed the outage after {noticed:?}: the default 30 s interval is in force"
    );
    wait_reason(
        "B's push Cluster",
        "ClusterConnected",
        "ClusterConnected",
        || b_clusters.get("p"),
    )
    .await;

    // --agent-offline-after-seconds=4 on B, the default 90 on A: the same heartbeat, left to
    // age, is offline on B and still connected on A.
    for ws in [&a_ws, &b_ws] {
        heartbeat(ws, "c").await;
    }
    wait_reason("B's Cluster", "AgentConnected", "AgentConnected", || {
        b_clusters.get("c")
    })
    .await;
    wait_reason("B's Cluster", "AgentConnected", "AgentOffline", || {
        b_clusters.get("c")
    })
    .await;
    let a_cluster = serde_json::to_value(a_clusters.get("c").await.unwrap()).unwrap();
    assert_eq!(
        reason_of(&a_cluster, "AgentConnected").as_deref(),
        Some("AgentConnected"),
        "A keeps the default 90 s"
    );

    // --cluster-summary-delay-seconds (clusterSummaryDelaySeconds=0 on B, the default 5 on A):
    // a Cluster's summary counting its first BundleDeployment is written at once by B and
    // about 5 s after the BundleDeployment by A.
    let mut gaps = Vec::new();
    for ws in [&a_ws, &b_ws] {
        gaps.push(summary_gap(ws).await);
    }
    assert!(
        gaps[0] >= Duration::from_secs(4),
        "A wrote the summary {:?} after the BundleDeployment: the 5 s delay is not in force",
        gaps[0]
    );
    assert!(
        gaps[1] < Duration::from_secs(4),
        "B wrote the summary {:?} after the BundleDeployment: a zero delay is not in force",
        gaps[1]
    );

    // The unserved workspace's Cluster was never touched by either hub.
    let c = unserved_clusters.get("c").await.unwrap();
    assert!(
        c.status.is_none() && c.finalizers().is_empty(),
        "unserved: {c:?}"
    );

    // --log-format (logFormat) and --log-level (logLevel).
    let (json, _, debug) = log_shape(&a.log());
    assert!(json && !debug, "A logs JSON at info:\n{}", a.log_tail());
    let (_, text, debug) = log_shape(&b.log());
    assert!(text && debug, "B logs text at debug:\n{}", b.log_tail());
    // --kubeconfig and --metrics-addr: both ran as the chart's ServiceAccount and answered on
    // the address given.
    for r in [&mut a, &mut b] {
        r.assert_running();
        let scraped = r.scrape().await;
        assert!(
            scraped.contains("tender_object_writes_total"),
            "{}",
            r.name()
        );
        // Requests in flight are tracked per verb and resource
        // (decision 0069-requests-in-flight-metric).
        assert!(
            scraped.contains("kube_requests_in_flight{verb="),
            "{}",
            r.name()
        );
        let refused = r.refusals();
        assert!(
            refused.is_empty(),
            "{} refused:\n{}",
            r.name(),
            refused.join("\n")
        );
    }
    eprintln!(
        "[{}] hub flags: leases, workspaces, KindNotAllowed, CopyFeatureDisabled, exec refused/used, \
         push probe noticed an outage after {:.1} s, AgentOffline after 4 s, Cluster summary \
         {:.1} s (default) / {:.1} s (0) after its BundleDeployment, log formats and levels",
        a_ws.ns,
        noticed.as_secs_f64(),
        gaps[0].as_secs_f64(),
        gaps[1].as_secs_f64()
    );
}

/// How long after its first BundleDeployment appears a new Cluster `summary` of `ws`'s hub
/// counts it: a Bundle of one manifest is made for a fresh Cluster, both observed by polling.
async fn summary_gap(ws: &Workspace) -> Duration {
    ws.cluster("summary").await;
    let clusters = Api::<Cluster>::namespaced(ws.hub.clone(), &ws.ns);
    eventually("Cluster summary provisioned", CONVERGE, || async {
        let c = clusters.get("summary").await?;
        Ok::<_, kube::Error>(c.status.and_then(|s| s.namespace).map(|_| ()))
    })
    .await;
    ws.bundle(
        "summary",
        json!({
            "targets": [{"clusterName": "summary"}],
            "defaultNamespace": "apps",
            "resources": [{"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "summary"}, "data": {"a": "b"}}],
        }),
    )
    .await;
    let bds = Api::<tender_types::BundleDeployment>::namespaced(
        ws.hub.clone(),
        &ws.cluster_ns("summary"),
    );
    let poll = Duration::from_millis(50);
    let deadline = Instant::now() + CONVERGE;
    let mut created = None;
    while Instant::now() < deadline {
        if created.is_none()
            && !bds
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .is_empty()
        {
            created = Some(Instant::now());
        }
        if let Some(at) = created {
            let summary = clusters
                .get("summary")
                .await
                .unwrap()
                .status
                .and_then(|s| s.summary);
            if summary.is_some_and(|s| s.desired_ready >= 1) {
                return at.elapsed();
            }
        }
        tokio::time::sleep(poll).await;
    }
    panic!(
        "{}: no Cluster summary counting the BundleDeployment",
        ws.ns
    );
}

/// The `exp - iat` of the token in kubeconfig text, and the token.
fn token_of(kubeconfig: &str) -> (String, i64) {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig).unwrap();
    let token = tender_agent::credentials::kubeconfig_token(&kc).expect("a token kubeconfig");
    use base64::Engine as _;
    let claims: Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token.split('.').nth(1).unwrap())
            .unwrap(),
    )
    .unwrap();
    let lifetime = claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap();
    (token, lifetime)
}

async fn stored_hub_kubeconfig(down: &kube::Client, ns: &str) -> String {
    let s = Api::<Secret>::namespaced(down.clone(), ns)
        .get("tender-agent-hub")
        .await
        .unwrap();
    String::from_utf8(s.data.unwrap()["kubeconfig"].0.clone()).unwrap()
}

#[tokio::test]
async fn every_agent_flag_and_chart_value_takes_effect_in_the_binary() {
    let env = OwnEnv::start(2).await;
    let ws = Workspace::without_hub(env.0, "flags-agent").await;
    let deployment = install_hub_chart(&ws.hub, &ws.ns, &[]).await;
    let _hub = Running::start(env.0, HUB, &deployment, "tender-hub-0", &[]).await;
    ws.source_secret("db-creds", &[("password", "v1")]).await;
    // Agent X: the chart's defaults. Agent Y: every value changed, and the flags the chart
    // does not expose.
    ws.cluster("x").await;
    ws.cluster("y").await;
    // X: Bundles may do anything (bundleServiceAccount.clusterAdmin,
    // decision 0079-bundles-applied-as-an-impersonated-service-account), so it creates namespaces;
    // Y: the Bundle ServiceAccount bound in `apps` only, which exists.
    let mut x = start_agent(
        &ws,
        "x",
        &downstream_name(1),
        AgentOpts {
            sets: &["bundleServiceAccount.clusterAdmin=true"],
            ..Default::default()
        },
    )
    .await;
    tender_e2e::fixture::create_namespace(&ws.downstream(&downstream_name(2)).await, "apps").await;
    let mut y = start_agent(
        &ws,
        "y",
        &downstream_name(2),
        AgentOpts {
            release_ns: Some("agents-y"),
            sets: &[
                "copyResourcesDownstream=false",
                "logFormat=text",
                "logLevel=debug",
                "hubToken.lifetimeSeconds=600",
                "hubToken.refreshMarginSeconds=598",
                "policy.allowedNamespaces={apps}",
                "policy.refusedKinds={ServiceAccount}",
                "bundleServiceAccount.namespaces={apps}",
                "policy.readableNamespaces={elsewhere}",
                "chartCache.sizeLimit=64Mi",
            ],
            flags: &[
                ("--heartbeat-seconds", "2"),
                ("--cluster-status-seconds", "1"),
            ],
            token_lifetime: Some(Duration::from_secs(600)),
            ..Default::default()
        },
    )
    .await;
    let x_down = ws.downstream(&downstream_name(1)).await;
    let y_down = ws.downstream(&downstream_name(2)).await;
    let x_stored = stored_hub_kubeconfig(&x_down, "tender-system").await;

    // One Bundle to both: a copy, a ConfigMap in `apps`, one in `elsewhere`, a ServiceAccount.
    ws.bundle(
        "app",
        json!({
            "targets": [{"clusterName": "x"}, {"clusterName": "y"}],
            "defaultNamespace": "apps",
            "downstreamResources": [{"kind": "Secret", "name": "db-creds"}],
            "upstreamResources": [{"kind": "ConfigMap", "name": "settings"}],
            "resources": [
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}},
                {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "stray", "namespace": "elsewhere"}},
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "puller"}}
            ],
        }),
    )
    .await;
    ws.ready("x", "app").await;
    let y_bds = ws.bds("y");
    // copyResourcesDownstream=false (EXPERIMENTAL_COPY_RESOURCES_DOWNSTREAM): nothing copied.
    wait_reason(
        "y's BundleDeployment",
        "ResourcesCopied",
        "CopyFeatureDisabled",
        || y_bds.get("app"),
    )
    .await;
    // policy.allowedNamespaces (--allowed-namespaces), policy.refusedKinds (--refused-kinds).
    let bd = wait_reason("y's BundleDeployment", "Ready", "RefusedByPolicy", || {
        y_bds.get("app")
    })
    .await;
    let text = bd.to_string();
    assert!(
        text.contains("stray") && text.contains("puller"),
        "both refusals named: {bd:#}"
    );
    let present =
        |down: &kube::Client, kind: &'static str, ns: &'static str, name: &'static str| {
            let down = down.clone();
            async move {
                match kind {
                    "Secret" => Api::<Secret>::namespaced(down, ns)
                        .get_opt(name)
                        .await
                        .unwrap()
                        .is_some(),
                    "ConfigMap" => Api::<ConfigMap>::namespaced(down, ns)
                        .get_opt(name)
                        .await
                        .unwrap()
                        .is_some(),
                    _ => Api::<ServiceAccount>::namespaced(down, ns)
                        .get_opt(name)
                        .await
                        .unwrap()
                        .is_some(),
                }
            }
        };
    for (kind, ns, name) in [
        ("Secret", "apps", "db-creds"),
        ("ConfigMap", "apps", "settings"),
        ("ConfigMap", "elsewhere", "stray"),
        ("ServiceAccount", "apps", "puller"),
    ] {
        assert!(
            present(&x_down, kind, ns, name).await,
            "x deployed {kind} {ns}/{name}"
        );
        let on_y = present(&y_down, kind, ns, name).await;
        assert_eq!(
            on_y,
            name == "settings",
            "y: {kind} {ns}/{name} present: {on_y}"
        );
    }

    // policy.readableNamespaces (--readable-namespaces): y may not read `apps` for a Bundle
    // (reverse sync of ConfigMap apps/settings refused); x (reads where it writes: all) may.
    let upstream_line = |bd: &Value| {
        bd.pointer("/status/upstream/0").map(|l| {
            (
                l["state"].as_str().map(str::to_string),
                l["message"].to_string(),
            )
        })
    };
    let x_bds = ws.bds("x");
    for (bds, want) in [(&x_bds, "Published"), (&y_bds, "Error")] {
        let line = eventually(&format!("the upstream line {want}"), CONVERGE, || async {
            let bd = serde_json::to_value(bds.get("app").await?).unwrap();
            Ok::<_, kube::Error>(
                upstream_line(&bd).filter(|(state, _)| state.as_deref() == Some(want)),
            )
        })
        .await;
        if want == "Error" {
            assert!(
                line.1.contains("ReadRefusedByPolicy")
                    && line.1.contains("--readable-namespaces elsewhere"),
                "{line:?}"
            );
        }
    }

    // POD_NAME (--identity), --heartbeat-seconds: the Lease; POD_NAMESPACE (--agent-namespace):
    // status.agent.namespace and the inventories; --workspace-namespace, --cluster-name: the
    // right Cluster.
    for (cluster, agent_ns, duration) in [("x", "tender-system", 90), ("y", "agents-y", 6)] {
        let lease = Api::<Lease>::namespaced(ws.hub.clone(), &ws.cluster_ns(cluster))
            .get(names::AGENT_LEASE)
            .await
            .unwrap();
        let spec = lease.spec.unwrap();
        assert_eq!(
            spec.holder_identity.as_deref(),
            Some(format!("tender-agent-{cluster}").as_str())
        );
        assert_eq!(
            spec.lease_duration_seconds,
            Some(duration),
            "{cluster}: 3 x heartbeat"
        );
        let c = Api::<Cluster>::namespaced(ws.hub.clone(), &ws.ns)
            .get(cluster)
            .await
            .unwrap();
        let agent = c.status.and_then(|s| s.agent).expect("status.agent");
        assert_eq!(agent.namespace.as_deref(), Some(agent_ns));
        let down = if cluster == "x" { &x_down } else { &y_down };
        let inventories = Api::<ConfigMap>::namespaced(down.clone(), agent_ns)
            .list(&ListParams::default().labels(labels::INVENTORY))
            .await
            .unwrap();
        assert!(
            !inventories.items.is_empty(),
            "{cluster}'s inventory in {agent_ns}"
        );
    }

    // --cluster-status-seconds=1 on y (300 on x): y's lastSeen moves, x's does not.
    let last_seen = |cluster: &'static str| {
        let api = Api::<Cluster>::namespaced(ws.hub.clone(), &ws.ns);
        async move {
            api.get(cluster)
                .await
                .unwrap()
                .status
                .and_then(|s| s.agent)
                .and_then(|a| a.last_seen)
                .map(|t| t.0.to_string())
        }
    };
    let (x_seen, y_seen) = (last_seen("x").await, last_seen("y").await);
    eventually("y's status.agent.lastSeen to move", CONVERGE, || async {
        Ok::<_, std::convert::Infallible>((last_seen("y").await != y_seen).then_some(()))
    })
    .await;
    assert_eq!(
        last_seen("x").await,
        x_seen,
        "x reports at most every 300 s"
    );

    // hubToken.lifetimeSeconds / refreshMarginSeconds (--hub-token-*), --hub-kubeconfig-secret:
    // y renews its 600 s token within seconds and stores it; x keeps its own.
    let first = token_of(&stored_hub_kubeconfig(&y_down, "agents-y").await).0;
    let renewed = eventually("y to store a renewed hub token", CONVERGE, || async {
        let (token, lifetime) = token_of(&stored_hub_kubeconfig(&y_down, "agents-y").await);
        Ok::<_, std::convert::Infallible>((token != first).then_some(lifetime))
    })
    .await;
    assert_eq!(
        renewed, 600,
        "the renewed token lives --hub-token-lifetime-seconds"
    );
    assert_eq!(
        token_of(&stored_hub_kubeconfig(&x_down, "tender-system").await).0,
        token_of(&x_stored).0,
        "x, 1 h token and a 20 min margin, renews nothing yet"
    );

    // --log-format, --log-level; --kubeconfig, --hub-kubeconfig and --metrics-addr in use.
    let (json, _, debug) = log_shape(&x.log());
    assert!(json && !debug, "x logs JSON at info:\n{}", x.log_tail());
    let (_, text, debug) = log_shape(&y.log());
    assert!(text && debug, "y logs text at debug:\n{}", y.log_tail());
    for r in [&mut x, &mut y] {
        r.assert_running();
        let scraped = r.scrape().await;
        assert!(
            scraped.contains("tender_agent_heartbeats_total"),
            "{}",
            r.name()
        );
        assert!(
            scraped.contains("kube_requests_in_flight{verb="),
            "{}",
            r.name()
        );
    }
}
