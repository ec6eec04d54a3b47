//! Resilience end to end: the hub taken away from an agent (cut connections, then 403s, then
//! writes left unanswered), a copy deleted by hand on the hub, and hub leader election with two
//! replicas.
//!
//! A real hub apiserver and a real downstream cluster; hubs and agents run in-process. An
//! outage is made with an in-process TCP proxy ([`tender_e2e::proxy::TcpProxy`]) between one
//! component and the hub apiserver, so everything else (the test, the other hub replica) keeps
//! talking to the same apiserver. Every test has its own workspace namespace, hub instance(s)
//! and Cluster registrations, so tests run in parallel.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use tender_e2e::agent_harness::{AgentHandle, start_agent};
use tender_e2e::fixture::{
    WAIT, Workspace, app_bundle, secret_value, snapshot, stays, wait_secret,
};
use tender_e2e::hub_harness::{HubHandle, hub_config, spawn_hub};
use tender_e2e::proxy::{TcpProxy, WriteGate, http_status};
use tender_e2e::{
    ADMIN_USER, HUB, client_from_yaml, downstream_name, eventually, shared_env, unique_name, within,
};
use tender_hub::HubConfig;
use tender_runtime::leader::LEASE_DURATION_SECONDS;
use tender_types::{BundleDeployment, labels, names};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

// ---------------------------------------------------------------------------------------------
// Small helpers.

/// Waits until the hub has written the rotated copy of Secret `source` (holding `password`)
/// for `bundle` on `cluster`: a rotation changes the copy, not the BundleDeployment (decision
/// 0089-signed-copies), whose deploymentID it returns.
async fn rotated_copy(
    ws: &Workspace,
    cluster: &str,
    bundle: &str,
    source: &str,
    password: &str,
) -> String {
    let bd = ws.bds(cluster).get(bundle).await.unwrap();
    let copy_name = bd
        .spec
        .options
        .downstream_resources
        .iter()
        .find(|c| c.name == source)
        .map(|c| c.copy_name.clone())
        .unwrap();
    let copies: Api<Secret> = Api::namespaced(ws.hub.clone(), &ws.cluster_ns(cluster));
    eventually(
        &format!("the rotated copy of {source} for {bundle} on {cluster}"),
        WAIT,
        || async {
            let copy = copies.get(&copy_name).await?;
            Ok::<_, kube::Error>(
                (secret_value(&copy, "password").as_deref() == Some(password)).then_some(()),
            )
        },
    )
    .await;
    bd.spec.deployment_id
}

/// Serves an agent's `/metrics`, `/healthz` and `/readyz` on a free loopback port, exactly as
/// the binary does.
async fn serve_probes(agent: &AgentHandle) -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = agent.metrics.shared();
    let health = agent.health.clone();
    let task = tokio::spawn(async move {
        let _ = tender_runtime::server::serve_on(listener, metrics, health).await;
    });
    (addr, task)
}

/// A counter sample from an OpenMetrics text, e.g. `tender_agent_heartbeats_total{target="lease",result="error"}`.
fn sample(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

fn lease_errors(agent: &AgentHandle) -> u64 {
    sample(
        &agent.metrics.shared().encode(),
        "tender_agent_heartbeats_total{target=\"lease\",result=\"error\"}",
    )
}

async fn kill(agent: AgentHandle) {
    agent.kill().await;
}

// ---------------------------------------------------------------------------------------------
// 1. The hub unreachable.

#[tokio::test]
async fn hub_unreachable_keeps_downstream_and_rotation_arrives_after_restore() {
    let ws = Workspace::new(shared_env(1).await, "res-cut").await;
    let (kubeconfig, config) = ws.register("east").await;
    let proxy = TcpProxy::for_server(&ws.env.cluster(HUB).server)
        .await
        .unwrap();
    let proxied = proxy.rewrite_kubeconfig(&kubeconfig, &ws.env.cluster(HUB).server);
    let downstream = downstream_name(1);
    let agent = start_agent(ws.env, &proxied, &downstream, config)
        .await
        .unwrap();
    let (probes, probe_server) = serve_probes(&agent).await;

    ws.source_secret("db-creds", &[("password", "one")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let target = unique_name("cut");
    ws.bundle("app", app_bundle(&["east"], &target)).await;
    let before = ws.ready("east", "app").await;
    assert!(
        proxy.forwarded() > 0,
        "the agent reaches the hub only through the proxy"
    );
    let down = ws.downstream(&downstream).await;
    let cluster_ns = ws.cluster_ns("east");
    let snap = snapshot(&down, &cluster_ns).await.unwrap();
    for object in [
        format!("Secret {target}/db-creds"),
        format!("ConfigMap {target}/app-config"),
        format!("ConfigMap {target}/app-settings"),
    ] {
        assert!(snap.contains_key(&object), "{object} deployed: {snap:?}");
    }
    eventually("the agent to report ready on /readyz", WAIT, || async {
        Ok::<_, std::io::Error>((http_status(probes, "/readyz").await? == 200).then_some(()))
    })
    .await;
    let deletes_before = agent.metrics.writes("delete") + agent.metrics.writes("strip");
    let lease_errors_before = lease_errors(&agent);
    eprintln!(
        "[{}] deployed {} objects; agent made {} hub connections through the proxy",
        ws.ns,
        snap.len(),
        proxy.forwarded()
    );

    // Cut: every open connection closed, new ones refused.
    proxy.cut();
    let cut_at = Instant::now();
    // While cut, the source rotates on the hub; the hub (not behind the proxy) processes it.
    ws.source_secret("db-creds", &[("password", "two")]).await;
    let rotated_id = rotated_copy(&ws, "east", "app", "db-creds", "two").await;
    assert_eq!(
        rotated_id, before.spec.deployment_id,
        "a rotation leaves the BundleDeployment alone"
    );

    // The deliberate observation window: ~20 s without the hub. Readiness means "caches
    // synced and controllers running", which a hub outage does not undo: the agent keeps its
    // last known state and retries, so it must stay ready (and live) throughout, not flap.
    let (mut probed, mut not_ready_seen) = (0, 0);
    while cut_at.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        probed += 1;
        assert!(!agent.is_finished(), "the agent process keeps running");
        assert_eq!(
            http_status(probes, "/healthz").await.unwrap(),
            200,
            "the agent stays live while the hub is unreachable"
        );
        if http_status(probes, "/readyz").await.unwrap() != 200 {
            not_ready_seen += 1;
        }
        assert_eq!(
            snapshot(&down, &cluster_ns).await.unwrap(),
            snap,
            "downstream objects stay exactly as they were while the hub is unreachable"
        );
    }
    assert!(probed >= 15, "only {probed} probes in the window");
    assert_eq!(
        not_ready_seen, 0,
        "/readyz answered not ready in {not_ready_seen} of {probed} probes while the hub was \
         unreachable; an outage must not make the agent unready"
    );
    assert_eq!(
        agent.metrics.writes("delete") + agent.metrics.writes("strip"),
        deletes_before,
        "no downstream delete or strip while the hub is unreachable"
    );
    assert!(
        proxy.cut_connections() > 0,
        "the cut closed the agent's open hub connections"
    );
    assert!(
        proxy.refused() > 0,
        "the agent kept retrying the hub while cut"
    );
    assert!(
        lease_errors(&agent) > lease_errors_before,
        "the heartbeat noticed the outage"
    );
    eprintln!(
        "[{}] cut for {:?}: {} open connections closed, {} connection attempts refused, \
         /readyz ready in all {probed} of the 1 s probes, downstream unchanged",
        ws.ns,
        cut_at.elapsed(),
        proxy.cut_connections(),
        proxy.refused()
    );

    // Restore: the rotation arrives by itself.
    proxy.restore();
    let restored_at = Instant::now();
    let rotated = wait_secret(
        &down,
        &target,
        "db-creds",
        "the rotation to arrive downstream",
        |s| secret_value(s, "password").as_deref() == Some("two"),
    )
    .await;
    let arrived = restored_at.elapsed();
    let after = ws.ready("east", "app").await;
    assert_eq!(after.spec.deployment_id, rotated_id);
    let now = snapshot(&down, &cluster_ns).await.unwrap();
    for (object, (uid, _)) in &snap {
        assert_eq!(
            now.get(object).map(|v| &v.0),
            Some(uid),
            "{object} updated in place, never recreated"
        );
    }
    assert_eq!(
        rotated.metadata.uid.as_ref(),
        Some(&snap[&format!("Secret {target}/db-creds")].0)
    );
    assert!(!agent.is_finished());
    eprintln!(
        "[{}] after restore: rotation downstream in {arrived:?}, status applied in {:?}",
        ws.ns,
        restored_at.elapsed()
    );
    probe_server.abort();
    kill(agent).await;
}

// ---------------------------------------------------------------------------------------------
// 2. The hub erroring (403 on everything in the cluster namespace).

#[tokio::test]
async fn hub_forbidding_the_agent_deletes_nothing_and_it_resumes_when_allowed_again() {
    let ws = Workspace::new(shared_env(1).await, "res-403").await;
    let (kubeconfig, config) = ws.register("east").await;
    let downstream = downstream_name(1);
    let agent = start_agent(ws.env, &kubeconfig, &downstream, config.clone())
        .await
        .unwrap();
    ws.source_secret("db-creds", &[("password", "one")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let target = unique_name("forbidden");
    ws.bundle("app", app_bundle(&["east"], &target)).await;
    let before = ws.ready("east", "app").await;
    let down = ws.downstream(&downstream).await;
    let cluster_ns = ws.cluster_ns("east");

    // Revoke: the agent's RoleBinding in its cluster namespace goes away.
    let bindings: Api<RoleBinding> = Api::namespaced(ws.hub.clone(), &cluster_ns);
    bindings
        .delete(names::AGENT_ROLE, &DeleteParams::default())
        .await
        .unwrap();
    let as_agent = client_from_yaml(&kubeconfig).await.unwrap();
    let agent_bds: Api<BundleDeployment> = Api::namespaced(as_agent.clone(), &cluster_ns);
    let forbidden = || async {
        match agent_bds.list(&ListParams::default()).await {
            Err(kube::Error::Api(s)) if s.code == 403 => Ok(Some(())),
            Err(e) => Err(e),
            Ok(_) => Ok(None),
        }
    };
    eventually(
        "the agent identity to get 403 on its namespace",
        WAIT,
        forbidden,
    )
    .await;
    // The running agent sees it (its 2 s heartbeat is refused).
    let errors = lease_errors(&agent);
    eventually("the running agent to hit the 403s", WAIT, || {
        let now = lease_errors(&agent);
        async move { Ok::<_, std::convert::Infallible>((now > errors).then_some(())) }
    })
    .await;
    // Stop the agent while the hub refuses it. (Watches it opened before the revocation keep
    // streaming: the apiserver authorizes a watch when it starts, so the old agent may still
    // have applied changes; what it left is the state to keep from here on.)
    kill(agent).await;
    let snap = snapshot(&down, &cluster_ns).await.unwrap();
    for object in [
        format!("Secret {target}/db-creds"),
        format!("ConfigMap {target}/app-config"),
        format!("ConfigMap {target}/app-settings"),
    ] {
        assert!(snap.contains_key(&object), "{object} deployed: {snap:?}");
    }
    // A change arrives on the hub meanwhile, so resuming has real work to do.
    ws.source_secret("db-creds", &[("password", "two")]).await;
    let rotated_id = rotated_copy(&ws, "east", "app", "db-creds", "two").await;
    assert_eq!(
        rotated_id, before.spec.deployment_id,
        "a rotation leaves the BundleDeployment alone"
    );

    // Start it again while the hub still refuses it: its start-up sweep runs against the 403s.
    let agent = start_agent(ws.env, &kubeconfig, &downstream, config.clone())
        .await
        .unwrap();
    let restarted_at = Instant::now();
    // The deliberate observation window.
    while restarted_at.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!agent.is_finished(), "the agent keeps running and retrying");
        assert!(
            !agent.health.is_ready(),
            "not ready before a successful start-up against the hub"
        );
        assert_eq!(
            snapshot(&down, &cluster_ns).await.unwrap(),
            snap,
            "nothing downstream changes while the hub refuses the agent"
        );
        // The premise holds for the whole window (nothing restored the RBAC behind our back).
        assert!(forbidden().await.unwrap().is_some(), "still forbidden");
    }
    assert_eq!(agent.metrics.writes("delete"), 0, "no downstream deletes");
    assert_eq!(agent.metrics.writes("strip"), 0, "no downstream strips");
    let lists = agent
        .metrics
        .shared()
        .kube_requests("list", "bundledeployments", "");
    assert!(
        lists >= 2,
        "the start-up list is retried with backoff ({lists} so far)"
    );
    eprintln!(
        "[{}] restarted agent against a 403ing hub for {:?}: {lists} BundleDeployment lists tried, downstream unchanged",
        ws.ns,
        restarted_at.elapsed()
    );

    // Restore the RBAC exactly as the hub provisions it.
    let binding = tender_hub::cluster::agent_access(&ws.ns, "east").role_binding;
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let restored_at = Instant::now();
    let after = ws.ready("east", "app").await;
    assert_eq!(after.spec.deployment_id, rotated_id);
    let status = after.status.as_ref().unwrap();
    assert_eq!(
        status.applied_deployment_id.as_deref(),
        Some(after.spec.deployment_id.as_str())
    );
    let secret = Api::<Secret>::namespaced(down.clone(), &target)
        .get("db-creds")
        .await
        .unwrap();
    assert_eq!(secret_value(&secret, "password").as_deref(), Some("two"));
    let now = snapshot(&down, &cluster_ns).await.unwrap();
    for (object, (uid, _)) in &snap {
        assert_eq!(
            now.get(object).map(|v| &v.0),
            Some(uid),
            "{object} kept (same uid) through the outage"
        );
    }
    assert_eq!(agent.metrics.writes("delete"), 0);
    eventually("the restarted agent to report ready", WAIT, || {
        let ready = agent.health.is_ready();
        async move { Ok::<_, std::convert::Infallible>(ready.then_some(())) }
    })
    .await;
    eprintln!(
        "[{}] RBAC restored: status applied in {:?}",
        ws.ns,
        restored_at.elapsed()
    );
    kill(agent).await;
}

// ---------------------------------------------------------------------------------------------
// 2b. The hub not answering the agent's writes.

/// The renewal time of the agent Lease in `leases`' namespace, if it was ever renewed.
async fn renewed_at(leases: &Api<Lease>) -> Option<MicroTime> {
    leases
        .get_opt(names::AGENT_LEASE)
        .await
        .unwrap()
        .and_then(|l| l.spec?.renew_time)
}

/// The hub apiserver stops answering the agent's writes (a gate holds them; reads pass): each
/// heartbeat write is given up after a third of the interval and tried again after 2 s, so the
/// agent keeps trying instead of waiting on one request until kube's 295 s read timeout, and
/// its Lease is renewed within seconds once writes flow again
/// (decision 0065-bounded-heartbeat-write).
#[tokio::test]
async fn a_hanging_heartbeat_write_is_given_up_and_the_lease_renewed_once_writes_flow() {
    let ws = Workspace::new(shared_env(1).await, "res-hang").await;
    let (kubeconfig, mut config) = ws.register("east").await;
    // Each attempt bounded to 1 s; after a failure the next comes after 2 s, then 3 s.
    config.heartbeat_interval = Duration::from_secs(3);
    let hub = ws.env.cluster(HUB).server.clone();
    // The gate forwards with the agent's own hub identity, so RBAC is the agent's.
    let gate = WriteGate::start(client_from_yaml(&kubeconfig).await.unwrap())
        .await
        .unwrap();
    let through = gate.rewrite_kubeconfig(&kubeconfig, &hub);
    let agent = start_agent(ws.env, &through, &downstream_name(1), config)
        .await
        .unwrap();
    let leases: Api<Lease> = Api::namespaced(ws.hub.clone(), &ws.cluster_ns("east"));
    let first = eventually("a Lease renewal through the gate", WAIT, || async {
        Ok::<_, std::convert::Infallible>(renewed_at(&leases).await.map(Some))
    })
    .await;
    assert!(gate.forwarded_writes() > 0, "renewals pass the gate");

    // Hold every write for up to 16 s: with the bound the agent gives each one up and tries
    // again (4 attempts in 16 s: ~1 s held + 2 s, ~1 s + 3 s, …; 3 asked, for slack under
    // load); without it the first held renewal would block the heartbeat for the whole window.
    let (held_before, errors_before) = (gate.held_total(), lease_errors(&agent));
    gate.hold_writes_after(0);
    within(Duration::from_secs(16), || async {
        gate.held_total() - held_before >= 3 && lease_errors(&agent) - errors_before >= 3
    })
    .await;
    let held = gate.held_total() - held_before;
    let errors = lease_errors(&agent) - errors_before;
    let stuck = renewed_at(&leases).await;
    assert!(
        held >= 3 && errors >= 3,
        "in 16 s of held writes the agent made {held} write attempts ({errors} Lease renewals \
         given up); a bounded heartbeat retries every few seconds"
    );
    assert!(!agent.is_finished(), "the agent keeps running");

    // The network eats what was held and writes flow again: the next renewal lands within a
    // retry (≤ 3 s) plus its own time, not after an interval of waiting on a dead request.
    gate.discard_held();
    let open_at = Instant::now();
    let renewed = eventually("a Lease renewal after writes flow again", WAIT, || async {
        let now = renewed_at(&leases).await;
        Ok::<_, std::convert::Infallible>((now > stuck).then_some(now))
    })
    .await;
    let after = open_at.elapsed();
    assert!(
        after < Duration::from_secs(8),
        "the Lease was renewed {after:?} after writes flowed again"
    );
    eprintln!(
        "[{}] hub writes held: {held} attempts, {errors} renewals given up; Lease renewed \
         {:.1} s after writes flowed again ({first:?} → {renewed:?})",
        ws.ns,
        after.as_secs_f64()
    );
    kill(agent).await;
}

// ---------------------------------------------------------------------------------------------
// 3. A copy deleted by hand on the hub.

#[tokio::test]
async fn copy_deleted_by_hand_on_the_hub_is_recreated_promptly() {
    let ws = Workspace::new(shared_env(1).await, "res-copy").await;
    ws.cluster("c-0").await;
    ws.source_secret("db-creds", &[("password", "one")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    ws.bundle("app", app_bundle(&["c-0"], "apps")).await;
    let cluster_ns = ws.cluster_ns("c-0");
    let bds = ws.bds("c-0");
    let bd = eventually("the BundleDeployment", WAIT, || async {
        bds.get_opt("app").await
    })
    .await;
    let secrets: Api<Secret> = Api::namespaced(ws.hub.clone(), &cluster_ns);
    let cms: Api<ConfigMap> = Api::namespaced(ws.hub.clone(), &cluster_ns);
    let secret_copy = names::copy_name("app", "Secret", "db-creds");
    let cm_copy = names::copy_name("app", "ConfigMap", "app-config");
    let original = eventually("the Secret copy", WAIT, || async {
        secrets.get_opt(&secret_copy).await
    })
    .await;
    let original_cm = eventually("the ConfigMap copy", WAIT, || async {
        cms.get_opt(&cm_copy).await
    })
    .await;

    // Both copies deleted by hand; each comes back, same content, owned by its
    // BundleDeployment again.
    let prompt = Duration::from_secs(10);
    secrets
        .delete(&secret_copy, &DeleteParams::default())
        .await
        .unwrap();
    cms.delete(&cm_copy, &DeleteParams::default())
        .await
        .unwrap();
    let deleted_at = Instant::now();
    let copy = eventually("the deleted Secret copy recreated", prompt, || async {
        Ok::<_, kube::Error>(
            secrets
                .get_opt(&secret_copy)
                .await?
                .filter(|s| s.metadata.uid != original.metadata.uid),
        )
    })
    .await;
    let secret_back = deleted_at.elapsed();
    assert_eq!(copy.data, original.data, "same content");
    assert_eq!(
        copy.metadata.annotations.as_ref().unwrap()[labels::CONTENT_HASH],
        original.metadata.annotations.as_ref().unwrap()[labels::CONTENT_HASH]
    );
    let cm = eventually("the deleted ConfigMap copy recreated", prompt, || async {
        Ok::<_, kube::Error>(
            cms.get_opt(&cm_copy)
                .await?
                .filter(|c| c.metadata.uid != original_cm.metadata.uid),
        )
    })
    .await;
    let cm_back = deleted_at.elapsed();
    assert_eq!(cm.data, original_cm.data, "same content");
    for (what, owners) in [
        ("Secret", copy.metadata.owner_references),
        ("ConfigMap", cm.metadata.owner_references),
    ] {
        let owners = owners.unwrap_or_default();
        assert!(
            owners
                .iter()
                .any(|o| o.kind == "BundleDeployment" && Some(&o.uid) == bd.metadata.uid.as_ref()),
            "the recreated {what} copy is owned by its BundleDeployment again: {owners:?}"
        );
    }
    eprintln!(
        "[{}] copies deleted by hand: Secret back after {secret_back:?}, ConfigMap after {cm_back:?}",
        ws.ns
    );
    // The content did not change, so neither did the deployment.
    assert_eq!(
        bds.get("app").await.unwrap().spec.deployment_id,
        bd.spec.deployment_id
    );
}

#[tokio::test]
async fn copy_edited_by_hand_on_the_hub_is_restored_by_the_hub() {
    let ws = Workspace::new(shared_env(1).await, "res-edit").await;
    ws.cluster("c-0").await;
    ws.source_secret("db-creds", &[("password", "one")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    ws.bundle("app", app_bundle(&["c-0"], "apps")).await;
    let cluster_ns = ws.cluster_ns("c-0");
    let secrets: Api<Secret> = Api::namespaced(ws.hub.clone(), &cluster_ns);
    let secret_copy = names::copy_name("app", "Secret", "db-creds");
    let original = eventually("the Secret copy", WAIT, || async {
        secrets.get_opt(&secret_copy).await
    })
    .await;

    // Someone with access to the cluster namespace changes a value and adds a key, leaving
    // tender's hash annotation in place.
    let tamper = serde_json::json!({"stringData": {"password": "tampered", "extra": "x"}});
    secrets
        .patch(
            &secret_copy,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&tamper),
        )
        .await
        .unwrap();
    let edited_at = Instant::now();
    let restored = eventually(
        "the hub to restore the edited copy",
        Duration::from_secs(10),
        || async {
            Ok::<_, kube::Error>(
                secrets
                    .get_opt(&secret_copy)
                    .await?
                    .filter(|s| s.data == original.data),
            )
        },
    )
    .await;
    eprintln!(
        "[{}] copy edited by hand: restored after {:?}",
        ws.ns,
        edited_at.elapsed()
    );
    // Only the hub manages the restored copy's content.
    let content_managers: Vec<Option<String>> = restored
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .and_then(|f| f.0.as_object())
                .is_some_and(|f| f.contains_key("f:data"))
        })
        .map(|m| m.manager.clone())
        .collect();
    assert!(
        !content_managers.is_empty(),
        "some manager owns the restored copy's data"
    );
    assert!(
        content_managers
            .iter()
            .all(|m| m.as_deref() == Some(labels::HUB_FIELD_MANAGER)),
        "only the hub owns the restored copy's data, not {content_managers:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Hub leader election.

/// A hub replica running in this process with its own client (maybe through a proxy).
struct Replica {
    identity: String,
    hub: HubHandle,
}

impl Replica {
    /// Starts a hub with `config` talking to the apiserver of `kubeconfig`; does not wait.
    async fn start(kubeconfig: &str, config: HubConfig) -> Self {
        let identity = config.leader_election.as_ref().unwrap().identity.clone();
        let hub = spawn_hub(kubeconfig, config).await.unwrap();
        Self { identity, hub }
    }

    /// Whether its controllers ever started (they watch Bundles only while leading).
    fn started_controllers(&self) -> bool {
        self.metrics.kube_requests("watch", "bundles", "") > 0
    }

    fn lease_reads(&self) -> u64 {
        self.metrics.kube_requests("get", "leases", "")
    }

    /// Graceful stop: releases the Lease.
    async fn stop(self) {
        tokio::time::timeout(Duration::from_secs(30), self.hub.stop())
            .await
            .expect("hub stops within 30 s")
            .expect("hub result");
    }
}

/// The replica's hub: its metrics, readiness and write count ([`HubHandle::writes`]: writes
/// sent, Lease requests excluded).
impl std::ops::Deref for Replica {
    type Target = HubHandle;

    fn deref(&self) -> &HubHandle {
        &self.hub
    }
}

async fn lease_holder(leases: &Api<Lease>) -> kube::Result<Option<String>> {
    Ok(leases
        .get_opt("tender-hub")
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity))
}

/// The leader-election test's bundle: one copy and a manifest whose data we change.
fn leader_bundle(mode: &str) -> Value {
    json!({
        "targets": [{"clusterName": "c-0"}],
        "defaultNamespace": "apps",
        "downstreamResources": [{"kind": "Secret", "name": "db-creds"}],
        "resources": [{
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "app-settings"}, "data": {"mode": mode}
        }],
    })
}

fn manifest_mode(bd: &BundleDeployment) -> Option<String> {
    bd.spec
        .resources
        .first()
        .and_then(|m| m.0.pointer("/data/mode"))
        .and_then(Value::as_str)
        .map(str::to_string)
}

#[tokio::test]
async fn hub_leader_election_one_writer_and_failover_within_the_lease() {
    let ws = Workspace::without_hub(shared_env(1).await, "res-leader").await;
    let env = ws.env;
    let server = env.cluster(HUB).server.clone();
    let admin_kubeconfig = env.kubeconfig_as(HUB, ADMIN_USER);
    // Both replicas compete for the same Lease (`<ws>/tender-hub`), each with its own identity.
    let config_a = hub_config(&ws.ns);
    let mut config_b = hub_config(&ws.ns);
    assert_eq!(
        config_a
            .leader_election
            .as_ref()
            .map(|l| (&l.namespace, &l.lease_name)),
        config_b
            .leader_election
            .as_ref()
            .map(|l| (&l.namespace, &l.lease_name))
    );
    config_b.instance = format!("{}-b", config_b.instance);
    let proxy = TcpProxy::for_server(&server).await.unwrap();
    let a = Replica::start(
        &proxy.rewrite_kubeconfig(&admin_kubeconfig, &server),
        config_a,
    )
    .await;
    eventually("replica A to lead and start its controllers", WAIT, || {
        let ok = a.started_controllers() && a.health.is_ready();
        async move { Ok::<_, std::convert::Infallible>(ok.then_some(())) }
    })
    .await;
    let b = Replica::start(&admin_kubeconfig, config_b).await;
    eventually("replica B to read the Lease as standby", WAIT, || {
        let ok = b.lease_reads() > 0 && b.health.is_ready();
        async move { Ok::<_, std::convert::Infallible>(ok.then_some(())) }
    })
    .await;
    let leases: Api<Lease> = Api::namespaced(ws.hub.clone(), &ws.ns);
    assert_eq!(
        lease_holder(&leases).await.unwrap().as_deref(),
        Some(a.identity.as_str())
    );

    ws.cluster("c-0").await;
    ws.source_secret("db-creds", &[("password", "one")]).await;
    ws.bundle("app", leader_bundle("v1")).await;
    let bds = ws.bds("c-0");
    let wait_mode = |mode: &'static str| {
        let bds = bds.clone();
        async move {
            eventually(
                &format!("the BundleDeployment with mode {mode}"),
                WAIT,
                || async {
                    let bd = bds.get_opt("app").await?;
                    Ok::<_, kube::Error>(bd.filter(|bd| manifest_mode(bd).as_deref() == Some(mode)))
                },
            )
            .await
        }
    };
    wait_mode("v1").await;
    // Only the leader writes; the standby never even started its controllers.
    assert!(
        a.writes() > 0,
        "the leader wrote the cluster and the bundle"
    );
    assert_eq!(b.writes(), 0, "the standby wrote nothing");
    assert!(!b.started_controllers(), "the standby runs no controllers");
    eprintln!(
        "[{}] leader A: {} writes; standby B: 0 writes",
        ws.ns,
        a.writes()
    );

    // The leader vanishes without releasing the Lease (its connections cut, like a crash or a
    // partition): B takes over once the Lease expires.
    let a_writes = a.writes();
    proxy.cut();
    let cut_at = Instant::now();
    eventually(
        "replica B to take the Lease over",
        Duration::from_secs(LEASE_DURATION_SECONDS + 30),
        || async {
            Ok::<_, kube::Error>(
                (lease_holder(&leases).await?.as_deref() == Some(b.identity.as_str()))
                    .then_some(()),
            )
        },
    )
    .await;
    let takeover = cut_at.elapsed();
    assert!(
        takeover <= Duration::from_secs(LEASE_DURATION_SECONDS + 8),
        "takeover after {takeover:?}, lease duration {LEASE_DURATION_SECONDS} s"
    );
    eventually("replica B to start its controllers", WAIT, || {
        let ok = b.started_controllers() && b.health.is_ready();
        async move { Ok::<_, std::convert::Infallible>(ok.then_some(())) }
    })
    .await;
    let changed_at = Instant::now();
    ws.bundle("app", leader_bundle("v2")).await;
    wait_mode("v2").await;
    assert!(b.hub_metrics.bundle_deployments_written.get() >= 1);
    eprintln!(
        "[{}] A cut: B holds the Lease after {takeover:?} (lease {LEASE_DURATION_SECONDS} s), \
         processed a Bundle change in {:?}",
        ws.ns,
        changed_at.elapsed()
    );

    // A comes back: it must stay a standby and write nothing while B leads.
    let reads = a.lease_reads();
    proxy.restore();
    eventually("replica A to read the Lease again", WAIT, || {
        let ok = a.lease_reads() > reads;
        async move { Ok::<_, std::convert::Infallible>(ok.then_some(())) }
    })
    .await;
    ws.bundle("app", leader_bundle("v3")).await;
    wait_mode("v3").await;
    // A deliberate observation window for a second writer to show itself: the old leader's
    // write count and the Lease holder stay put across it. The count is taken once it has
    // settled: a request A sent while it still led is counted when it ends, and one held by the
    // cut connection ends only after the cut (split_brain.rs proves from the audit log that
    // the last write comes before the standby's acquireTime).
    let a_settled = tender_e2e::fixture::settled(
        "the old leader's writes",
        Duration::from_secs(2),
        || async { a.writes() },
    )
    .await;
    assert!(a_settled >= a_writes);
    stays(
        "the old leader's writes (it lost the Lease) and the Lease holder",
        Duration::from_secs(5),
        &(a_settled, Some(b.identity.clone())),
        || async { (a.writes(), lease_holder(&leases).await.unwrap()) },
    )
    .await;

    // B stops gracefully (releases the Lease): A takes over within the lease duration.
    b.stop().await;
    let stopped_at = Instant::now();
    eventually(
        "replica A to take the Lease back",
        Duration::from_secs(LEASE_DURATION_SECONDS + 30),
        || async {
            let holder = lease_holder(&leases).await?;
            Ok::<_, kube::Error>((holder.as_deref() == Some(a.identity.as_str())).then_some(()))
        },
    )
    .await;
    let takeback = stopped_at.elapsed();
    assert!(
        takeback <= Duration::from_secs(LEASE_DURATION_SECONDS + 8),
        "takeover after {takeback:?}"
    );
    let written = a.hub_metrics.bundle_deployments_written.get();
    ws.bundle("app", leader_bundle("v4")).await;
    wait_mode("v4").await;
    assert!(a.hub_metrics.bundle_deployments_written.get() > written);
    eprintln!(
        "[{}] B stopped: A holds the Lease after {takeback:?} and processed a Bundle change",
        ws.ns
    );
    a.stop().await;
}
