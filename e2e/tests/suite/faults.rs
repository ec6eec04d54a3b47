//! Faults on real processes (issue 14): tender's real binaries (`tender-hub`, `tender-agent`)
//! started as processes from the Helm charts' rendered Deployments, each with the identity its
//! chart grants ([`tender_e2e::running`]), on environments of their own whose components are
//! killed and restarted for real: the hub process (SIGKILL), a kube-apiserver process, etcd.
//! Every documented flag is checked in `flags.rs`.
//!
//! The always-on sizes fit CI; `TENDER_E2E_FULL_FAULTS=1` runs the full sizes (500
//! clusters and five kills, 60 s outages). `TENDER_E2E_FAULT_SEED` replays the kill points of a
//! run (each run prints its seed). The tests take turns (one environment at a time on 2 cores),
//! and every process's log goes to a file whose tail is printed when a test fails.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tender_e2e::audit::service_account_user;
use tender_e2e::fixture::{Workspace, app_bundle, secret_value, settled, snapshot, stays};
use tender_e2e::proxy::{GatedIdentity, TcpProxy, WriteGate};
use tender_e2e::running::{AgentOpts, OwnEnv, Running, install_hub_chart, start_agent, sum_of};
use tender_e2e::{HUB, downstream_name, eventually, unique_name};
use tender_runtime::leader::LEASE_DURATION_SECONDS;
use tender_types::{BundleDeployment, Cluster, labels, names};

/// How long a fault test waits for convergence after a fault (generous: 500 clusters on 2
/// shared cores, namespaces deleted by the controller-manager).
/// Long enough for a delayed Cluster summary write (decision 0053-cluster-summary-delay) to have
/// happened.
const QUIET: Duration =
    Duration::from_secs(3 + tender_hub::DEFAULT_CLUSTER_SUMMARY_DELAY.as_secs());
const CONVERGE: Duration = Duration::from_secs(300);

// Each test starts its own environment (and restarts only its own components); the binaries
// they run get kernel-chosen ports: the tests run side by side (issue 38 item 3).

/// Whether to run the full sizes (`TENDER_E2E_FULL_FAULTS=1`).
fn full() -> bool {
    std::env::var("TENDER_E2E_FULL_FAULTS").is_ok_and(|v| v == "1")
}

// ---------------------------------------------------------------------------------------------
// Kill points.

/// A small deterministic generator (xorshift64*) so a run's kill points can be replayed.
struct Rng(u64);

impl Rng {
    fn from_env() -> Self {
        let seed = std::env::var("TENDER_E2E_FAULT_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        eprintln!("fault seed: TENDER_E2E_FAULT_SEED={seed}");
        Self(seed.max(1))
    }

    /// A value in `lo..hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        lo + (r % (hi - lo).max(1) as u64) as usize
    }
}

// ---------------------------------------------------------------------------------------------
// What exists on the hub.

/// Everything tender keeps in one workspace on the hub, by `Kind namespace/name`, with what
/// must match: a copy's data, a BundleDeployment's copy hashes, a Cluster's status namespace.
type HubState = BTreeMap<String, String>;

fn key<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    format!(
        "{} {}/{}",
        K::kind(&()),
        obj.meta().namespace.as_deref().unwrap_or_default(),
        obj.meta().name.as_deref().unwrap_or_default()
    )
}

/// Lists every tender-labelled object of workspace `ws`, and its Clusters.
async fn hub_state(hub: &kube::Client, ws: &str) -> kube::Result<HubState> {
    let lp = ListParams::default().labels(&format!("{}={ws}", labels::WORKSPACE));
    let mut out = HubState::new();
    for o in Api::<Namespace>::all(hub.clone())
        .list_metadata(&lp)
        .await?
    {
        out.insert(key(&o), String::new());
    }
    for o in Api::<ServiceAccount>::all(hub.clone())
        .list_metadata(&lp)
        .await?
    {
        out.insert(key(&o), String::new());
    }
    for o in Api::<Role>::all(hub.clone()).list_metadata(&lp).await? {
        out.insert(key(&o), String::new());
    }
    for o in Api::<RoleBinding>::all(hub.clone())
        .list_metadata(&lp)
        .await?
    {
        out.insert(key(&o), String::new());
    }
    // The copies' content hashes (signed on each copy since decision 0089-signed-copies; the
    // BundleDeployment names the copies only).
    let mut hashes: BTreeMap<(String, String), String> = BTreeMap::new();
    let hash_of = |meta: &kube::api::ObjectMeta| {
        let a = meta.annotations.as_ref();
        a.and_then(|a| a.get(labels::CONTENT_HASH))
            .cloned()
            .unwrap_or_default()
    };
    for s in Api::<Secret>::all(hub.clone()).list(&lp).await? {
        hashes.insert(
            (s.namespace().unwrap_or_default(), s.name_any()),
            hash_of(&s.metadata),
        );
        out.insert(key(&s), secret_value(&s, "password").unwrap_or_default());
    }
    for c in Api::<ConfigMap>::all(hub.clone()).list(&lp).await? {
        hashes.insert(
            (c.namespace().unwrap_or_default(), c.name_any()),
            hash_of(&c.metadata),
        );
        let mode = c.data.as_ref().and_then(|d| d.get("mode")).cloned();
        out.insert(key(&c), mode.unwrap_or_default());
    }
    for bd in Api::<BundleDeployment>::all(hub.clone()).list(&lp).await? {
        out.insert(key(&bd), copy_hashes(&bd, &hashes));
    }
    for c in Api::<Cluster>::namespaced(hub.clone(), ws)
        .list(&ListParams::default())
        .await?
    {
        let ns = c.status.as_ref().and_then(|s| s.namespace.clone());
        out.insert(key(&c), ns.unwrap_or_default());
    }
    Ok(out)
}

fn copy_hashes(bd: &BundleDeployment, hashes: &BTreeMap<(String, String), String>) -> String {
    let copies = &bd.spec.options.downstream_resources;
    let ns = bd.namespace().unwrap_or_default();
    let mut listed: Vec<String> = copies
        .iter()
        .map(|c| {
            let hash = hashes
                .get(&(ns.clone(), c.copy_name.clone()))
                .cloned()
                .unwrap_or_default();
            format!("{}={hash}", c.copy_name)
        })
        .collect();
    listed.sort();
    listed.join(",")
}

/// What the fan-out test's workspace must hold: `clusters` registered, Bundle `app` targeting
/// `targeted`, its copies holding `password`, its BundleDeployments listing `hashes` (the
/// current sources' `copy_name=hash,…`).
fn model(
    ws: &str,
    clusters: &BTreeSet<String>,
    targeted: &BTreeSet<String>,
    password: &str,
    hashes: &str,
) -> HubState {
    let mut out = HubState::new();
    for c in clusters {
        let access = tender_hub::cluster::agent_access(ws, c);
        let cns = names::cluster_namespace(ws, c);
        out.insert(key(&access.namespace), String::new());
        out.insert(key(&access.service_account), String::new());
        out.insert(key(&access.role), String::new());
        out.insert(key(&access.role_binding), String::new());
        out.insert(key(&access.workspace_role), String::new());
        out.insert(key(&access.workspace_role_binding), String::new());
        out.insert(format!("Cluster {ws}/{c}"), cns.clone());
        if targeted.contains(c) {
            let copy = |kind: &str, source: &str| {
                format!("{kind} {cns}/{}", names::copy_name("app", kind, source))
            };
            out.insert(copy("Secret", "db-creds"), password.to_string());
            out.insert(copy("ConfigMap", "app-config"), "blue".to_string());
            out.insert(
                format!(
                    "BundleDeployment {cns}/{}",
                    names::bundle_deployment_name("app")
                ),
                hashes.to_string(),
            );
        }
    }
    out
}

/// The differences between `want` and `have`, a few of each kind, for failure messages.
fn diff(want: &HubState, have: &HubState) -> String {
    let missing: Vec<&String> = want.keys().filter(|k| !have.contains_key(*k)).collect();
    let extra: Vec<&String> = have.keys().filter(|k| !want.contains_key(*k)).collect();
    let wrong: Vec<String> = want
        .iter()
        .filter_map(|(k, v)| {
            let h = have.get(k)?;
            (h != v).then(|| format!("{k}: {h:?} (want {v:?})"))
        })
        .collect();
    format!(
        "{} missing {:?}…, {} orphaned {:?}…, {} stale {:?}…",
        missing.len(),
        &missing[..missing.len().min(5)],
        extra.len(),
        &extra[..extra.len().min(5)],
        wrong.len(),
        &wrong[..wrong.len().min(5)],
    )
}

/// Waits until the hub holds exactly `want`; returns how long that took.
async fn converge(hub: &kube::Client, ws: &str, want: &HubState, what: &str) -> Duration {
    let start = Instant::now();
    loop {
        let last = match hub_state(hub, ws).await {
            Ok(have) if &have == want => return start.elapsed(),
            Ok(have) => diff(want, &have),
            Err(e) => format!("listing: {e}"),
        };
        assert!(
            start.elapsed() < CONVERGE,
            "{what}: not converged after {CONVERGE:?}: {last}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// 1. The hub SIGKILLed during a fan-out.

fn cluster_name(i: usize) -> String {
    format!("c-{i:04}")
}

fn fan_out_bundle(half: Option<&str>) -> Value {
    let selector = match half {
        Some(h) => json!({"matchLabels": {"half": h}}),
        None => json!({"matchLabels": {"env": "test"}}),
    };
    json!({
        "targets": [{"clusterSelector": selector}],
        "defaultNamespace": "apps",
        "downstreamResources": [
            {"kind": "Secret", "name": "db-creds"},
            {"kind": "ConfigMap", "name": "app-config"}
        ],
        "resources": [{
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "app-settings"}, "data": {"mode": "blue"}
        }],
    })
}

/// `copy_name=hash,…` of the current sources, sorted (as [`copy_hashes`] lists them).
async fn source_hashes(ws: &Workspace) -> String {
    let secret = Api::<Secret>::namespaced(ws.hub.clone(), &ws.ns)
        .get("db-creds")
        .await
        .unwrap();
    let config = Api::<ConfigMap>::namespaced(ws.hub.clone(), &ws.ns)
        .get("app-config")
        .await
        .unwrap();
    let mut listed = [
        format!(
            "{}={}",
            names::copy_name("app", "Secret", "db-creds"),
            tender_types::hash::secret_hash(&secret)
        ),
        format!(
            "{}={}",
            names::copy_name("app", "ConfigMap", "app-config"),
            tender_types::hash::config_map_hash(&config)
        ),
    ];
    listed.sort();
    listed.join(",")
}

async fn count<K>(api: Api<K>, lp: &ListParams, keep: impl Fn(&K) -> bool) -> usize
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(lp)
        .await
        .map(|l| l.items.iter().filter(|o| keep(o)).count())
        .unwrap_or(0)
}

/// The agent chart's Bundle ServiceAccount may write the namespaces these tests create as they
/// go: faults, not RBAC, are their subject (least_privilege.rs proves the chart's default).
const FAULTS_NOT_RBAC: &[&str] = &["bundleServiceAccount.clusterAdmin=true"];

/// Does for the BundleDeployments of workspace `ws` the one thing their agents (none runs in
/// this test) do last when one is deleted: remove the agent's finalizer. The copies then go
/// with it (garbage collector, owner reference).
fn release_agent_finalizers(hub: kube::Client, ws: String) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let lp = ListParams::default().labels(&format!("{}={ws}", labels::WORKSPACE));
        let all: Api<BundleDeployment> = Api::all(hub.clone());
        loop {
            for bd in all
                .list_metadata(&lp)
                .await
                .map(|l| l.items)
                .unwrap_or_default()
            {
                if bd.metadata.deletion_timestamp.is_none() {
                    continue;
                }
                let ns = bd.metadata.namespace.clone().unwrap_or_default();
                let _ = Api::<BundleDeployment>::namespaced(hub.clone(), &ns)
                    .patch(
                        &bd.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                    )
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
}

/// Whether `path` is a Lease's (leader election, agent heartbeats).
fn is_lease(path: &str) -> bool {
    path.starts_with("/apis/coordination.k8s.io/")
}

/// The writes a gate forwarded other than Lease writes: the hub's work.
fn work_writes(gate: &WriteGate) -> u64 {
    gate.forwarded_log()
        .iter()
        .filter(|w| !is_lease(&w.path))
        .count() as u64
}

/// The identity of the agent of `cluster` (workspace `ws`) on the hub.
fn agent_user(ws: &str, cluster: &str) -> String {
    let sa = tender_hub::cluster::agent_access(ws, cluster).service_account;
    service_account_user(&sa.namespace().unwrap(), &sa.name_any())
}

/// Waits until each agent's downstream cluster holds exactly the fan-out Bundle's objects in
/// namespace `apps` — copy `db-creds` with `password`, copy `app-config`, manifest
/// `app-settings`, each once, nothing else tender-managed — and checks the agents still run.
async fn downstream_converged(
    ws: &Workspace,
    agents: &mut [(String, String, Running)],
    password: &str,
    what: &str,
) {
    let want: BTreeSet<String> = [
        "ConfigMap apps/app-config",
        "ConfigMap apps/app-settings",
        "Secret apps/db-creds",
    ]
    .map(str::to_string)
    .into();
    let managed = ListParams::default().labels(&format!(
        "{}={}",
        labels::MANAGED_BY,
        labels::MANAGED_BY_VALUE
    ));
    for (cluster, downstream, agent) in agents.iter_mut() {
        let down = ws.downstream(downstream).await;
        let secrets: Api<Secret> = Api::namespaced(down.clone(), "apps");
        let configs: Api<ConfigMap> = Api::namespaced(down, "apps");
        eventually(
            &format!("{what}: {cluster} on {downstream} holds exactly the rotated objects"),
            CONVERGE,
            || async {
                let s = secrets.list(&managed).await?;
                let c = configs.list(&managed).await?;
                let have: BTreeSet<String> = s
                    .items
                    .iter()
                    .map(key)
                    .chain(c.items.iter().map(key))
                    .collect();
                let rotated = s.items.iter().any(|s| {
                    s.name_any() == "db-creds"
                        && secret_value(s, "password").as_deref() == Some(password)
                });
                Ok::<_, kube::Error>((have == want && rotated).then_some(()))
            },
        )
        .await;
        agent.assert_running();
    }
}

#[tokio::test]
async fn the_hub_sigkilled_during_a_fan_out_converges_to_exactly_the_right_objects() {
    let n = if full() { 500 } else { 100 };
    let env = OwnEnv::start(2).await;
    let ws = Workspace::without_hub(env.0, "faults-kill").await;
    let deployment = install_hub_chart(&ws.hub, &ws.ns, &[]).await;
    // The hub reaches its apiserver only through a write gate (as its own ServiceAccount).
    let gated = GatedIdentity::of_deployment(env.0, HUB, &deployment).await;
    let gate = &gated.gate;
    let (flag, kubeconfig) = gated.flag();
    let mut hub = Running::start(
        env.0,
        HUB,
        &deployment,
        "tender-hub-0",
        &[(flag, &kubeconfig)],
    )
    .await;
    let mut rng = Rng::from_env();
    let in_ws = ListParams::default().labels(&format!("{}={}", labels::WORKSPACE, ws.ns));
    let mut clusters = BTreeSet::new();
    let mut targeted = BTreeSet::new();
    let mut figures = Vec::new();

    // Arms the gate so that only a random `allowance` (a fifth to four fifths of `total`) of
    // the hub's writes pass, starts the phase, and SIGKILLs the hub once its further writes
    // are held: the kill provably lands mid-phase (each unit of `progress` takes at least one
    // write of the hub, so it stops below `total`). The held writes are dropped unsent, the
    // hub restarts (a container restart: same pod, same Lease identity, the gate open) and
    // must converge to exactly `want`. Returns where the phase stopped.
    macro_rules! kill_during {
        ($phase:expr, $total:expr, $start:block, $progress:expr, $want:expr) => {{
            let total: usize = $total;
            // No write left over from the last phase (delayed Cluster summaries) may use the
            // allowance up.
            settled(
                &format!("the hub's writes before {}", $phase),
                QUIET,
                || {
                    let n = work_writes(gate);
                    async move { n }
                },
            )
            .await;
            let allowance = rng.range(total / 5, total * 4 / 5) as u64;
            let before = work_writes(gate);
            // Its Lease renewals flow (held, they would end its leadership first).
            gate.hold_matching_after(allowance, |_, path| !is_lease(path));
            $start;
            eventually(
                &format!("{}: the hub's writes held", $phase),
                CONVERGE,
                || {
                    let held = !gate.holding().is_empty();
                    async move { Ok::<_, std::convert::Infallible>(held.then_some(())) }
                },
            )
            .await;
            let progress = $progress;
            let seen = progress().await;
            hub.kill();
            let killed = Instant::now();
            let passed = work_writes(gate) - before;
            // Only the hub makes this progress: with it dead, the count says where it stopped.
            let stopped_at = progress().await;
            assert_eq!(
                passed, allowance,
                "{}: exactly the allowance passed",
                $phase
            );
            assert!(
                stopped_at < total,
                "{}: the kill landed after the phase finished ({stopped_at}/{total}, {passed} \
                 writes passed)",
                $phase
            );
            gate.discard_held();
            hub.restart().await;
            let took = converge(&ws.hub, &ws.ns, &$want, $phase).await;
            hub.assert_running();
            eprintln!(
                "[{}] SIGKILL during {} after {passed} of its writes, at {seen}/{total} (stopped \
                 at {stopped_at}): exactly right {:.1} s after the kill ({:.1} s after the \
                 restart)",
                ws.ns,
                $phase,
                killed.elapsed().as_secs_f64(),
                took.as_secs_f64()
            );
            figures.push(($phase, stopped_at, total, killed.elapsed()));
            stopped_at
        }};
    }

    // Sources first, so every phase has copies to write.
    ws.source_secret("db-creds", &[("password", "v1")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;

    // 1. Provisioning: N Clusters registered (16 at a time) while the hub provisions them.
    let cluster_api: Api<Cluster> = Api::namespaced(ws.hub.clone(), &ws.ns);
    clusters.extend((0..n).map(cluster_name));
    let hashes = source_hashes(&ws).await;
    let namespaces: Api<Namespace> = Api::all(ws.hub.clone());
    let register;
    kill_during!(
        "provisioning",
        n,
        {
            let api = cluster_api.clone();
            register = tokio::spawn(async move {
                use futures::StreamExt;
                let creates = (0..n).map(|i| {
                    let api = api.clone();
                    async move {
                        let cluster: Cluster = serde_json::from_value(json!({
                            "apiVersion": "tender.dev/v1alpha1", "kind": "Cluster",
                            "metadata": {"name": cluster_name(i), "labels": {
                                "env": "test", "half": if i % 2 == 0 { "a" } else { "b" }
                            }},
                            "spec": {}
                        }))
                        .unwrap();
                        api.create(&PostParams::default(), &cluster).await.unwrap();
                    }
                });
                futures::stream::iter(creates)
                    .buffer_unordered(16)
                    .collect::<Vec<()>>()
                    .await;
            });
        },
        || count(namespaces.clone(), &in_ws, |_| true),
        model(&ws.ns, &clusters, &targeted, "v1", &hashes)
    );
    register.await.unwrap();

    // Real agents on two Clusters that stay targeted through every phase (even: "half a";
    // not a multiple of 3: never deleted), on two downstream clusters.
    let mut agents = Vec::new();
    for (i, c) in [(1, cluster_name(2)), (2, cluster_name(4))] {
        let downstream = downstream_name(i);
        let agent = start_agent(
            &ws,
            &c,
            &downstream,
            AgentOpts {
                sets: FAULTS_NOT_RBAC,
                ..Default::default()
            },
        )
        .await;
        agents.push((c, downstream, agent));
    }

    // 2. The fan-out: one Bundle selecting every Cluster.
    targeted.clone_from(&clusters);
    let bds: Api<BundleDeployment> = Api::all(ws.hub.clone());
    let stopped_at = kill_during!(
        "the fan-out",
        n,
        {
            ws.bundle("app", fan_out_bundle(None)).await;
        },
        || count(bds.clone(), &in_ws, |_| true),
        model(&ws.ns, &clusters, &targeted, "v1", &hashes)
    );
    assert!(
        stopped_at > 0,
        "the fan-out had begun when the hub was killed"
    );
    downstream_converged(&ws, &mut agents, "v1", "after the fan-out").await;

    // 3. A rotation of the Secret: every copy and BundleDeployment rewritten.
    let copies: Api<Secret> = Api::all(ws.hub.clone());
    let stopped_at = kill_during!(
        "the rotation",
        n,
        {
            ws.source_secret("db-creds", &[("password", "v2")]).await;
        },
        || count(copies.clone(), &in_ws, |s| secret_value(s, "password")
            .as_deref()
            == Some("v2")),
        model(
            &ws.ns,
            &clusters,
            &targeted,
            "v2",
            &source_hashes(&ws).await
        )
    );
    assert!(
        stopped_at > 0,
        "the rotation had begun when the hub was killed"
    );
    let hashes = source_hashes(&ws).await;
    downstream_converged(&ws, &mut agents, "v2", "after the rotation").await;

    {
        // 4. Untargeting half the Clusters: their BundleDeployments and copies deleted. (No
        // agent runs on the untargeted half: the finalizer is released here.)
        let release = release_agent_finalizers(ws.hub.clone(), ws.ns.clone());
        targeted = (0..n).step_by(2).map(cluster_name).collect();
        kill_during!(
            "untargeting half",
            n - targeted.len(),
            {
                ws.bundle("app", fan_out_bundle(Some("a"))).await;
            },
            || async {
                n - count(bds.clone(), &in_ws, |bd| {
                    bd.metadata.deletion_timestamp.is_none()
                })
                .await
            },
            model(&ws.ns, &clusters, &targeted, "v2", &hashes)
        );
        release.abort();

        // 5. Deleting a third of the Clusters (targeted or not): namespaces, RBAC, all of it.
        let gone: Vec<String> = (0..n).step_by(3).map(cluster_name).collect();
        for c in &gone {
            clusters.remove(c);
            targeted.remove(c);
        }
        kill_during!(
            "deleting a third of the Clusters",
            gone.len(),
            {
                for c in &gone {
                    cluster_api
                        .delete(c, &DeleteParams::default())
                        .await
                        .unwrap();
                }
            },
            || async {
                let left = count(cluster_api.clone(), &ListParams::default(), |_| true).await;
                n - left
            },
            model(&ws.ns, &clusters, &targeted, "v2", &hashes)
        );
    }
    downstream_converged(&ws, &mut agents, "v2", "after all the kills").await;

    // Idle after all of it: no write at all.
    let writes = settled("the hub's writes", QUIET, || hub.writes()).await;
    stays(
        "the idle hub's writes",
        Duration::from_secs(5),
        &writes,
        || hub.writes(),
    )
    .await;
    assert_eq!(
        hub_state(&ws.hub, &ws.ns).await.unwrap(),
        model(&ws.ns, &clusters, &targeted, "v2", &hashes),
        "still exactly the right objects"
    );
    // No refusal, counted by the hub's apiserver: the hub's and the agents' identities each
    // made requests, and none was answered 401 or 403.
    let audit = env.0.audit(HUB);
    eprintln!(
        "[{}] the hub apiserver's audit log: {} requests of tender's identities, {} bytes",
        ws.ns,
        audit.answers.len(),
        std::fs::metadata(env.0.audit_log(HUB)).map_or(0, |m| m.len())
    );
    audit.assert_never_refused(&gated.user, "the hub");
    for (c, _, _) in &agents {
        audit.assert_never_refused(&agent_user(&ws.ns, c), &format!("the agent of {c}"));
    }
    for (phase, stopped_at, total, took) in &figures {
        eprintln!(
            "[{}] N={n}: killed during {phase} at {stopped_at}/{total}, exactly right {:.1} s later",
            ws.ns,
            took.as_secs_f64()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 2. Outages of the hub's kube-apiserver, a downstream kube-apiserver and etcd.

/// The downstream objects of each agent's cluster namespace by `Kind ns/name` → uid.
async fn uids(ws: &Workspace, agents: &[(&str, String)]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (cluster, downstream) in agents {
        let down = ws.downstream(downstream).await;
        let snap = snapshot(&down, &ws.cluster_ns(cluster)).await.unwrap();
        out.extend(
            snap.into_iter()
                .map(|(k, (uid, _))| (format!("{downstream}: {k}"), uid)),
        );
    }
    out
}

/// Downstream deletions and strips an agent made (`tender_agent_objects_written_total`).
async fn agent_removals(agent: &Running) -> u64 {
    sum_of(
        &agent.scrape().await,
        "tender_agent_objects_written_total{",
        |l| l.contains("action=\"delete\"") || l.contains("action=\"strip\""),
    )
}

/// Waits until copy `db-creds` in `target` holds `password` on each of `downstreams`;
/// returns how long that took.
async fn rotation_arrives(
    ws: &Workspace,
    downstreams: &[String],
    target: &str,
    password: &str,
) -> Duration {
    let start = Instant::now();
    for d in downstreams {
        let down = ws.downstream(d).await;
        let secrets: Api<Secret> = Api::namespaced(down, target);
        eventually(&format!("password {password} on {d}"), CONVERGE, || async {
            let s = secrets.get_opt("db-creds").await?;
            Ok::<_, kube::Error>(
                s.filter(|s| secret_value(s, "password").as_deref() == Some(password))
                    .map(|_| ()),
            )
        })
        .await;
    }
    start.elapsed()
}

#[tokio::test]
async fn outages_of_the_hub_apiserver_a_downstream_apiserver_and_etcd_delete_nothing() {
    let outage = Duration::from_secs(if full() { 60 } else { 15 });
    let env = OwnEnv::start(2).await;
    let ws = Workspace::without_hub(env.0, "faults-outage").await;
    let deployment = install_hub_chart(&ws.hub, &ws.ns, &[]).await;
    let mut hub = Running::start(env.0, HUB, &deployment, "tender-hub-0", &[]).await;
    ws.source_secret("db-creds", &[("password", "v0")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let placement = [("east", downstream_name(1)), ("west", downstream_name(2))];
    let mut agents = Vec::new();
    for (cluster, downstream) in &placement {
        ws.cluster(cluster).await;
        agents.push(
            start_agent(
                &ws,
                cluster,
                downstream,
                AgentOpts {
                    sets: FAULTS_NOT_RBAC,
                    ..Default::default()
                },
            )
            .await,
        );
    }
    let target = unique_name("outage");
    ws.bundle("app", app_bundle(&["east", "west"], &target))
        .await;
    for (cluster, _) in &placement {
        ws.ready(cluster, "app").await;
    }
    let before = uids(&ws, &placement).await;
    assert_eq!(
        before.len(),
        2 * 4,
        "copies, manifest and inventory on each: {before:?}"
    );
    let all: Vec<String> = placement.iter().map(|(_, d)| d.clone()).collect();

    let faults = [
        ("the hub's kube-apiserver", format!("{HUB}/kube-apiserver")),
        (
            "downstream-1's kube-apiserver",
            format!("{}/kube-apiserver", downstream_name(1)),
        ),
        ("etcd", "etcd".to_string()),
    ];
    let mut figures = Vec::new();
    for (i, (what, component)) in faults.iter().enumerate() {
        let password = format!("v{}", i + 1);
        env.0.stop_component(component);
        let stopped = Instant::now();
        // While the hub's apiserver is up, a rotation is made during the outage: the clusters
        // that can be reached get it at once.
        let hub_up = component != "etcd" && !component.starts_with(HUB);
        if hub_up {
            ws.source_secret("db-creds", &[("password", &password)])
                .await;
            rotation_arrives(&ws, &all[1..], &target, &password).await;
        }
        // Nothing reachable loses anything, and every process rides the outage out.
        while stopped.elapsed() < outage {
            for (cluster, downstream) in &placement {
                if component.starts_with(downstream.as_str()) || component == "etcd" {
                    continue;
                }
                let now = uids(&ws, &[(cluster, downstream.clone())]).await;
                for (k, uid) in &now {
                    assert_eq!(
                        before.get(k),
                        Some(uid),
                        "{k} replaced during the outage of {what}"
                    );
                }
                assert_eq!(
                    now.len(),
                    4,
                    "{downstream} kept everything during the outage of {what}"
                );
            }
            hub.assert_running();
            for a in &mut agents {
                a.assert_running();
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        env.0.start_component(component).await.unwrap();
        let restored = Instant::now();
        if !hub_up {
            ws.source_secret("db-creds", &[("password", &password)])
                .await;
        }
        let caught_up = rotation_arrives(&ws, &all, &target, &password).await;
        let after = uids(&ws, &placement).await;
        assert_eq!(
            after, before,
            "the same objects (same uids) after the outage of {what}"
        );
        for a in &agents {
            assert_eq!(agent_removals(a).await, 0, "{} removed nothing", a.name());
        }
        eprintln!(
            "[{}] {what} down {:.0} s: nothing deleted; restarted and ready {:.1} s later, the rotation \
             {} arrived on both clusters {:.1} s after that",
            ws.ns,
            outage.as_secs_f64(),
            (restored - stopped - outage).as_secs_f64(),
            if hub_up {
                "made during the outage"
            } else {
                "made after the restart"
            },
            caught_up.as_secs_f64(),
        );
        figures.push((*what, caught_up));
    }
    // (No check of the hub's log for 403s here: a freshly restarted apiserver refuses requests
    // for a moment while its RBAC cache fills. The chart's RBAC is checked by the other tests.)
    hub.assert_running();
    for (what, took) in figures {
        eprintln!(
            "[{}] {what}: caught up in {:.1} s",
            ws.ns,
            took.as_secs_f64()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 3. An agent whose access is revoked while it watches.

#[tokio::test]
async fn an_agent_whose_access_is_revoked_mid_watch_deletes_nothing_and_resumes() {
    let window = Duration::from_secs(if full() { 30 } else { 10 });
    let env = OwnEnv::start(1).await;
    let ws = Workspace::without_hub(env.0, "faults-revoke").await;
    let deployment = install_hub_chart(&ws.hub, &ws.ns, &[]).await;
    let mut hub = Running::start(env.0, HUB, &deployment, "tender-hub-0", &[]).await;
    ws.source_secret("db-creds", &[("password", "v1")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let downstream = downstream_name(1);
    ws.cluster("east").await;
    let proxy = TcpProxy::for_server(&env.0.cluster(HUB).server)
        .await
        .unwrap();
    let mut agent = start_agent(
        &ws,
        "east",
        &downstream,
        AgentOpts {
            via: Some(&proxy),
            sets: FAULTS_NOT_RBAC,
            ..Default::default()
        },
    )
    .await;
    let target = unique_name("revoke");
    ws.bundle("app", app_bundle(&["east"], &target)).await;
    ws.ready("east", "app").await;
    let placement = [("east", downstream.clone())];
    let before = uids(&ws, &placement).await;

    // Revoke: the agent's RoleBinding in its cluster namespace goes. Watches opened before
    // keep streaming (the apiserver authorizes a watch when it starts) until the apiserver
    // ends them; the agent's connections are cut here so that its re-lists meet the 403 now.
    // (Restarting the hub's apiserver would end them too, but the hub then re-leads and
    // re-provisions the RoleBinding at once: it heals a revocation it did not make.)
    let cluster_ns = ws.cluster_ns("east");
    let bindings: Api<RoleBinding> = Api::namespaced(ws.hub.clone(), &cluster_ns);
    bindings
        .delete(names::AGENT_ROLE, &DeleteParams::default())
        .await
        .unwrap();
    let open = proxy.cut_connections();
    proxy.cut();
    eventually("the agent's hub connections closed", CONVERGE, || {
        let closed = proxy.cut_connections() > open;
        async move { Ok::<_, std::convert::Infallible>(closed.then_some(())) }
    })
    .await;
    proxy.restore();
    // A rotation waits on the hub; the agent cannot see it.
    ws.source_secret("db-creds", &[("password", "v2")]).await;
    // Counted where it happens: the hub's apiserver answered the agent's identity 403.
    let agent_identity = agent_user(&ws.ns, "east");
    assert!(
        env.0.audit(HUB).refusals_of(&agent_identity).is_empty(),
        "nothing refused before the revocation"
    );
    eventually(
        "the agent's re-list refused (403 in the hub's audit log)",
        CONVERGE,
        || {
            let refused = !env.0.audit(HUB).refusals_of(&agent_identity).is_empty();
            async move { Ok::<_, std::convert::Infallible>(refused.then_some(())) }
        },
    )
    .await;
    let revoked = Instant::now();
    let down = ws.downstream(&downstream).await;
    let copies: Api<Secret> = Api::namespaced(down.clone(), &target);
    while revoked.elapsed() < window {
        assert_eq!(
            uids(&ws, &placement).await,
            before,
            "nothing downstream changes"
        );
        let copy = copies.get("db-creds").await.unwrap();
        assert_eq!(
            secret_value(&copy, "password").as_deref(),
            Some("v1"),
            "the revoked agent cannot have read the rotation"
        );
        agent.assert_running();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(
        agent_removals(&agent).await,
        0,
        "no downstream deletes or strips"
    );
    assert!(
        bindings.get_opt(names::AGENT_ROLE).await.unwrap().is_none(),
        "the revocation held for the whole window"
    );

    // Access returns exactly as the hub provisions it.
    let binding = tender_hub::cluster::agent_access(&ws.ns, "east").role_binding;
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let resumed = rotation_arrives(&ws, std::slice::from_ref(&downstream), &target, "v2").await;
    ws.ready("east", "app").await;
    assert_eq!(
        uids(&ws, &placement).await,
        before,
        "the same objects (same uids)"
    );
    assert_eq!(agent_removals(&agent).await, 0);
    hub.assert_running();
    eprintln!(
        "[{}] agent refused for {:.0} s ({} answers 401/403 to {agent_identity} in the hub's \
         audit log): nothing deleted; the rotation arrived {:.1} s after the RoleBinding returned",
        ws.ns,
        window.as_secs_f64(),
        env.0.audit(HUB).refusals_of(&agent_identity).len(),
        resumed.as_secs_f64()
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Two hub replicas.

async fn lease_holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt("tender-hub")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

#[tokio::test]
async fn two_hub_replicas_fail_over_within_the_lease_without_write_fights() {
    let n = 20;
    let env = OwnEnv::start(0).await;
    let ws = Workspace::without_hub(env.0, "faults-replicas").await;
    let deployment = install_hub_chart(&ws.hub, &ws.ns, &[]).await;
    let release_ns = deployment.namespace().unwrap();
    let leases: Api<Lease> = Api::namespaced(ws.hub.clone(), &release_ns);
    let mut a = Running::start(env.0, HUB, &deployment, "tender-hub-0", &[]).await;
    eventually("tender-hub-0 to hold the Lease", CONVERGE, || async {
        Ok::<_, std::convert::Infallible>(
            (lease_holder(&leases).await.as_deref() == Some("tender-hub-0")).then_some(()),
        )
    })
    .await;
    let b = Running::start(env.0, HUB, &deployment, "tender-hub-1", &[]).await;

    ws.source_secret("db-creds", &[("password", "v1")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;
    let clusters: BTreeSet<String> = (0..n).map(cluster_name).collect();
    for c in &clusters {
        let cluster: Cluster = serde_json::from_value(json!({
            "apiVersion": "tender.dev/v1alpha1", "kind": "Cluster",
            "metadata": {"name": c, "labels": {"env": "test", "half": "a"}}, "spec": {}
        }))
        .unwrap();
        Api::<Cluster>::namespaced(ws.hub.clone(), &ws.ns)
            .create(&PostParams::default(), &cluster)
            .await
            .unwrap();
    }
    ws.bundle("app", fan_out_bundle(None)).await;
    let hashes = source_hashes(&ws).await;
    converge(
        &ws.hub,
        &ws.ns,
        &model(&ws.ns, &clusters, &clusters, "v1", &hashes),
        "two replicas",
    )
    .await;
    let a_writes = a.writes().await;
    assert!(a_writes > 0, "the leader did the work");
    assert_eq!(b.writes().await, 0, "the standby wrote nothing");

    // The leader crashes (SIGKILL: it releases nothing); the standby takes over once the
    // Lease expires.
    a.kill();
    let killed = Instant::now();
    eventually("tender-hub-1 to take the Lease over", CONVERGE, || async {
        Ok::<_, std::convert::Infallible>(
            (lease_holder(&leases).await.as_deref() == Some("tender-hub-1")).then_some(()),
        )
    })
    .await;
    let takeover = killed.elapsed();
    assert!(
        takeover <= Duration::from_secs(LEASE_DURATION_SECONDS + 8),
        "takeover after {takeover:?}, lease duration {LEASE_DURATION_SECONDS} s"
    );
    // Its caches were warm: taking over a converged workspace costs (almost) no write.
    let takeover_writes = settled("the new leader's writes", QUIET, || b.writes()).await;
    // The old leader comes back (a container restart): a standby now.
    a.restart().await;
    ws.source_secret("db-creds", &[("password", "v2")]).await;
    let hashes = source_hashes(&ws).await;
    let changed = Instant::now();
    converge(
        &ws.hub,
        &ws.ns,
        &model(&ws.ns, &clusters, &clusters, "v2", &hashes),
        "after failover",
    )
    .await;
    let processed = changed.elapsed();
    let b_writes = settled("the new leader's writes", QUIET, || b.writes()).await;
    assert!(
        // One copy per cluster; no BundleDeployment write (decision 0089-signed-copies).
        b_writes >= takeover_writes + n as u64,
        "the new leader rotated the copies"
    );
    // Idle: neither replica writes; the restarted one never did.
    stays(
        "both replicas' writes while idle, and the Lease holder",
        Duration::from_secs(5),
        &(0, b_writes, Some("tender-hub-1".to_string())),
        || async {
            (
                a.writes().await,
                b.writes().await,
                lease_holder(&leases).await,
            )
        },
    )
    .await;
    // Both replicas are the chart's ServiceAccount: never refused, by the apiserver's count.
    let hub_user = service_account_user(
        &release_ns,
        &deployment
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|s| s.service_account_name.clone())
            .unwrap(),
    );
    env.0
        .audit(HUB)
        .assert_never_refused(&hub_user, "the hub replicas");
    eprintln!(
        "[{}] leader SIGKILLed: tender-hub-1 held the Lease after {:.1} s (lease {LEASE_DURATION_SECONDS} s) \
         and wrote {takeover_writes} times taking over; a rotation of {n} clusters took {:.1} s \
         ({} writes by the new leader, 0 by the restarted standby, 0 by either while idle)",
        ws.ns,
        takeover.as_secs_f64(),
        processed.as_secs_f64(),
        b_writes - takeover_writes
    );
}
