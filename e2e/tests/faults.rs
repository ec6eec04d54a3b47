//! Faults on real processes (issue 14): tender's real binaries (`tender-hub`, `tender-agent`)
//! started as processes from the Helm charts' rendered Deployments, each with the identity its
//! chart grants (the hub as the chart's ServiceAccount, an agent as the agent chart's downstream
//! ServiceAccount with a hub kubeconfig of the agent identity the hub provisioned — tokens from
//! the TokenRequest API, never admin), on environments of their own whose components are killed
//! and restarted for real: the hub process (SIGKILL), a kube-apiserver process, etcd.
//!
//! The always-on sizes fit CI; `TENDER_E2E_FULL_FAULTS=1` runs the full sizes (500
//! clusters and five kills, 60 s outages). `TENDER_E2E_FAULT_SEED` replays the kill points of a
//! run (each run prints its seed). The tests take turns (one environment at a time on 2 cores),
//! and every process's log goes to a file whose tail is printed when a test fails.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tender_e2e::apply::apply_yaml;
use tender_e2e::binaries::tender_binaries;
use tender_e2e::fixture::{
    Workspace, app_bundle, create_namespace, secret_value, settled, snapshot, stays,
};
use tender_e2e::hub_harness::agent_token;
use tender_e2e::local_pod::local_pod;
use tender_e2e::proxy::{TcpProxy, http_get};
use tender_e2e::{
    EnvOptions, HUB, Process, TestEnv, downstream_name, eventually, kubeconfig_yaml, unique_name,
};
use tender_runtime::leader::LEASE_DURATION_SECONDS;
use tender_types::{BundleDeployment, Cluster, labels, names};

/// How long a fault test waits for convergence after a fault (generous: 500 clusters on 2
/// shared cores, namespaces deleted by the controller-manager).
const CONVERGE: Duration = Duration::from_secs(300);

/// The tests take turns: each starts its own environment and restarts its components.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Whether to run the full sizes (`TENDER_E2E_FULL_FAULTS=1`).
fn full() -> bool {
    std::env::var("TENDER_E2E_FULL_FAULTS").is_ok_and(|v| v == "1")
}

// ---------------------------------------------------------------------------------------------
// The environment and the processes.

/// An environment of one test (leaked for the fixtures' `'static`), stopped when dropped.
struct OwnEnv(&'static TestEnv);

impl OwnEnv {
    async fn start(downstream: usize) -> Self {
        let env = TestEnv::start(EnvOptions {
            downstream,
            state_dir: None,
        })
        .await
        .expect("starting the test environment");
        Self(Box::leak(Box::new(env)))
    }
}

impl Drop for OwnEnv {
    fn drop(&mut self) {
        self.0.stop();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `helm template` of one of the charts with `args` (`--set …`), rendered by the pinned Helm.
fn helm_template(chart: &str, namespace: &str, args: &[String]) -> String {
    let helm = tender_e2e::ensure_helm().expect("building helm");
    let out = Command::new(helm)
        .args(["template", chart])
        .arg(repo_root().join("deploy/charts").join(chart))
        .args(["-n", namespace])
        .args(args)
        .output()
        .expect("running helm");
    assert!(
        out.status.success(),
        "helm template {chart}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// tender's binary running as a process from a chart's Deployment: its log, its metrics.
/// When a test fails, dropping it prints the tail of its log.
struct Running {
    process: Process,
    metrics: SocketAddr,
}

impl Running {
    /// Starts container 0 of `deployment` (stored on `client`'s cluster at `server`) as pod
    /// `pod_name`, with its Secret volumes as files and its ServiceAccount's token; only the
    /// metrics address and the kubeconfig path are set, plus `flags`.
    async fn start(
        env: &TestEnv,
        cluster: &str,
        deployment: &Deployment,
        pod_name: &str,
        flags: &[(&str, &str)],
    ) -> Self {
        let client = env.client(cluster).await.unwrap();
        let dir = env.state_dir().join(unique_name(pod_name));
        let mut pod = local_pod(
            &client,
            &env.cluster(cluster).server,
            env.ca_pem(),
            deployment,
            pod_name,
            &dir,
        )
        .await
        .unwrap();
        let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        pod.set_flag("--metrics-addr", &metrics.to_string());
        let kubeconfig = pod.kubeconfig.display().to_string();
        pod.set_flag("--kubeconfig", &kubeconfig);
        for (flag, value) in flags {
            pod.set_flag(flag, value);
        }
        let bins = tokio::task::spawn_blocking(tender_binaries)
            .await
            .unwrap()
            .expect("building the binaries");
        let program = if deployment.name_any() == "tender-hub" {
            &bins.hub
        } else {
            &bins.agent
        };
        let process = Process::start_with_env(
            pod_name,
            program,
            &pod.args,
            &pod.env,
            &dir.join(format!("{pod_name}.log")),
        )
        .unwrap();
        let running = Self { process, metrics };
        running.wait_ready().await;
        running
    }

    fn name(&self) -> &str {
        self.process.name()
    }

    async fn wait_ready(&self) {
        eventually(
            &format!("{} to be ready", self.name()),
            CONVERGE,
            || async {
                let ready = http_get(self.metrics, "/readyz")
                    .await
                    .is_ok_and(|(code, _)| code == 200);
                Ok::<_, std::convert::Infallible>(ready.then_some(()))
            },
        )
        .await;
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.process.log()).unwrap_or_default()
    }

    fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Its `/metrics` text (empty while it does not answer).
    async fn scrape(&self) -> String {
        http_get(self.metrics, "/metrics")
            .await
            .map(|(_, body)| body)
            .unwrap_or_default()
    }

    /// Every write its executor made (`tender_object_writes_total`, all verbs and kinds).
    async fn writes(&self) -> u64 {
        sum_of(&self.scrape().await, "tender_object_writes_total{", |_| {
            true
        })
    }

    /// SIGKILL, like a crash or an OOM kill: no Lease release, no graceful anything.
    fn kill(&mut self) {
        self.process.kill();
    }

    /// Starts the same command again (a container restart in the same pod).
    async fn restart(&mut self) {
        self.process.restart().unwrap();
        self.wait_ready().await;
    }

    fn assert_running(&mut self) {
        assert!(
            self.process.exited().is_none(),
            "{} exited; its log ends:\n{}",
            self.name(),
            self.log_tail()
        );
    }

    /// Lines of its log that show an RBAC refusal.
    fn refusals(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| {
                let l = l.to_ascii_lowercase();
                l.contains("forbidden") || l.contains(" 403") || l.contains("unauthorized")
            })
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- last lines of {} ({}):\n{}",
                self.name(),
                self.process.log().display(),
                self.log_tail()
            );
        }
    }
}

/// The sum of the samples of the series starting with `prefix` whose labels pass `keep`.
fn sum_of(text: &str, prefix: &str, keep: impl Fn(&str) -> bool) -> u64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .filter_map(|rest| rest.split_once("} "))
        .filter(|(labels, _)| keep(labels))
        .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
        .sum()
}

/// The hub chart rendered for workspace `ws` (plus `sets`) and applied in a fresh release
/// namespace; its Deployment.
async fn install_hub_chart(hub: &kube::Client, ws: &str, sets: &[&str]) -> Deployment {
    let release_ns = unique_name("tender-system");
    create_namespace(hub, &release_ns).await;
    apply_hub_chart(hub, &release_ns, ws, sets).await
}

/// The hub chart rendered for workspace `ws` (plus `sets`) and applied in `release_ns`; its
/// Deployment. (Its ClusterRoleBinding has a fixed name: one release namespace per cluster.)
async fn apply_hub_chart(
    hub: &kube::Client,
    release_ns: &str,
    ws: &str,
    sets: &[&str],
) -> Deployment {
    let mut args = vec!["--set".to_string(), format!("workspaceNamespaces={{{ws}}}")];
    for s in sets {
        args.extend(["--set".to_string(), (*s).to_string()]);
    }
    apply_yaml(hub, &helm_template("tender-hub", release_ns, &args))
        .await
        .unwrap();
    Api::<Deployment>::namespaced(hub.clone(), release_ns)
        .get("tender-hub")
        .await
        .unwrap()
}

/// How [`start_agent`] installs and runs an agent.
#[derive(Default)]
struct AgentOpts<'a> {
    /// The agent chart's release namespace downstream (default `tender-system`).
    release_ns: Option<&'a str>,
    /// `--set` values of the agent chart.
    sets: &'a [&'a str],
    /// Flags the chart does not expose.
    flags: &'a [(&'a str, &'a str)],
    /// A proxy the agent reaches the hub's apiserver through.
    via: Option<&'a TcpProxy>,
    /// Lifetime of the registration token in its hub kubeconfig (default 1 h).
    token_lifetime: Option<Duration>,
}

/// Starts the agent of Cluster `cluster` (registered in `ws`) on cluster `downstream` the way
/// the agent chart installs it: the chart rendered with a hub kubeconfig of the agent's own
/// identity (an expiring token of the ServiceAccount the hub provisioned, as `tender cluster
/// add` writes it), applied downstream, its Deployment run as a process with the chart's
/// downstream ServiceAccount.
async fn start_agent(
    ws: &Workspace,
    cluster: &str,
    downstream: &str,
    opts: AgentOpts<'_>,
) -> Running {
    let env = ws.env;
    let lifetime = opts.token_lifetime.unwrap_or(Duration::from_secs(3600));
    let token = agent_token(&ws.hub, &ws.cluster_ns(cluster), lifetime)
        .await
        .unwrap();
    let hub_server = &env.cluster(HUB).server;
    let server = opts
        .via
        .map_or_else(|| hub_server.clone(), TcpProxy::server);
    let hub_kubeconfig = kubeconfig_yaml(
        HUB,
        &server,
        env.ca_pem(),
        &format!("tender-agent-{cluster}"),
        &token,
    );
    let file = env.state_dir().join(unique_name("hub-kubeconfig"));
    std::fs::write(&file, hub_kubeconfig).unwrap();
    let mut args = vec![
        "--set".to_string(),
        format!("clusterName={cluster}"),
        "--set".to_string(),
        format!("workspaceNamespace={}", ws.ns),
        "--set-file".to_string(),
        format!("hubKubeconfig={}", file.display()),
    ];
    for s in opts.sets {
        args.extend(["--set".to_string(), (*s).to_string()]);
    }
    let release_ns = opts.release_ns.unwrap_or("tender-system");
    let down = env.client(downstream).await.unwrap();
    create_namespace(&down, release_ns).await;
    apply_yaml(&down, &helm_template("tender-agent", release_ns, &args))
        .await
        .unwrap();
    let deployment = Api::<Deployment>::namespaced(down.clone(), release_ns)
        .get("tender-agent")
        .await
        .unwrap();
    Running::start(
        env,
        downstream,
        &deployment,
        &format!("tender-agent-{cluster}"),
        opts.flags,
    )
    .await
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

/// Polls `progress` until it reaches `at` (or `total`: the phase finished before the kill
/// point); returns the progress seen.
async fn reach<F, Fut>(what: &str, at: usize, mut progress: F) -> usize
where
    F: FnMut() -> Fut,
    Fut: Future<Output = usize>,
{
    eventually(&format!("{what} to reach {at}"), CONVERGE, || {
        let p = progress();
        async move { Ok::<_, std::convert::Infallible>(Some(p.await).filter(|p| *p >= at)) }
    })
    .await
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
    for s in Api::<Secret>::all(hub.clone()).list(&lp).await? {
        out.insert(key(&s), secret_value(&s, "password").unwrap_or_default());
    }
    for c in Api::<ConfigMap>::all(hub.clone()).list(&lp).await? {
        let mode = c.data.as_ref().and_then(|d| d.get("mode")).cloned();
        out.insert(key(&c), mode.unwrap_or_default());
    }
    for bd in Api::<BundleDeployment>::all(hub.clone()).list(&lp).await? {
        out.insert(key(&bd), copy_hashes(&bd));
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

fn copy_hashes(bd: &BundleDeployment) -> String {
    let copies = &bd.spec.options.downstream_resources;
    let mut listed: Vec<String> = copies
        .iter()
        .map(|c| format!("{}={}", c.copy_name, c.hash))
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

#[tokio::test]
async fn the_hub_sigkilled_during_a_fan_out_converges_to_exactly_the_right_objects() {
    let _serial = SERIAL.lock().await;
    let n = if full() { 500 } else { 100 };
    let env = OwnEnv::start(0).await;
    let ws = Workspace::without_hub(env.0, "faults-kill").await;
    let deployment = install_hub_chart(&ws.hub, &ws.ns, &[]).await;
    let mut hub = Running::start(env.0, HUB, &deployment, "tender-hub-0", &[]).await;
    let mut rng = Rng::from_env();
    let in_ws = ListParams::default().labels(&format!("{}={}", labels::WORKSPACE, ws.ns));
    let mut clusters = BTreeSet::new();
    let mut targeted = BTreeSet::new();
    let mut figures = Vec::new();

    // Kills the hub once `progress` reaches a random point of `total`, restarts it at once (a
    // container restart: same pod, same Lease identity) and waits for exactly `want`.
    macro_rules! kill_during {
        ($phase:expr, $total:expr, $progress:expr, $want:expr) => {{
            let total: usize = $total;
            let at = rng.range(total / 5, total * 4 / 5);
            let seen = reach($phase, at, $progress).await;
            hub.kill();
            let killed = Instant::now();
            hub.restart().await;
            let took = converge(&ws.hub, &ws.ns, &$want, $phase).await;
            hub.assert_running();
            eprintln!(
                "[{}] SIGKILL during {} at {seen}/{total}: exactly right {:.1} s after the kill \
                 ({:.1} s after the restart)",
                ws.ns,
                $phase,
                killed.elapsed().as_secs_f64(),
                took.as_secs_f64()
            );
            figures.push(($phase, seen, total, killed.elapsed()));
        }};
    }

    // Sources first, so every phase has copies to write.
    ws.source_secret("db-creds", &[("password", "v1")]).await;
    ws.source_config_map("app-config", &[("mode", "blue")])
        .await;

    // 1. Provisioning: N Clusters registered (16 at a time) while the hub provisions them.
    let cluster_api: Api<Cluster> = Api::namespaced(ws.hub.clone(), &ws.ns);
    let register = {
        let api = cluster_api.clone();
        tokio::spawn(async move {
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
        })
    };
    clusters.extend((0..n).map(cluster_name));
    let hashes = source_hashes(&ws).await;
    let namespaces: Api<Namespace> = Api::all(ws.hub.clone());
    kill_during!(
        "provisioning",
        n,
        || count(namespaces.clone(), &in_ws, |_| true),
        model(&ws.ns, &clusters, &targeted, "v1", &hashes)
    );
    register.await.unwrap();

    // 2. The fan-out: one Bundle selecting every Cluster.
    ws.bundle("app", fan_out_bundle(None)).await;
    targeted.clone_from(&clusters);
    let bds: Api<BundleDeployment> = Api::all(ws.hub.clone());
    kill_during!(
        "the fan-out",
        n,
        || count(bds.clone(), &in_ws, |_| true),
        model(&ws.ns, &clusters, &targeted, "v1", &hashes)
    );

    // 3. A rotation of the Secret: every copy and BundleDeployment rewritten.
    ws.source_secret("db-creds", &[("password", "v2")]).await;
    let hashes = source_hashes(&ws).await;
    let copies: Api<Secret> = Api::all(ws.hub.clone());
    kill_during!(
        "the rotation",
        n,
        || count(copies.clone(), &in_ws, |s| secret_value(s, "password")
            .as_deref()
            == Some("v2")),
        model(&ws.ns, &clusters, &targeted, "v2", &hashes)
    );

    {
        // 4. Untargeting half the Clusters: their BundleDeployments and copies deleted.
        let agents = release_agent_finalizers(ws.hub.clone(), ws.ns.clone());
        ws.bundle("app", fan_out_bundle(Some("a"))).await;
        targeted = (0..n).step_by(2).map(cluster_name).collect();
        kill_during!(
            "untargeting half",
            n - targeted.len(),
            || async {
                n - count(bds.clone(), &in_ws, |bd| {
                    bd.metadata.deletion_timestamp.is_none()
                })
                .await
            },
            model(&ws.ns, &clusters, &targeted, "v2", &hashes)
        );
        agents.abort();

        // 5. Deleting a third of the Clusters (targeted or not): namespaces, RBAC, all of it.
        let gone: Vec<String> = (0..n).step_by(3).map(cluster_name).collect();
        for c in &gone {
            cluster_api
                .delete(c, &DeleteParams::default())
                .await
                .unwrap();
            clusters.remove(c);
            targeted.remove(c);
        }
        kill_during!(
            "deleting a third of the Clusters",
            gone.len(),
            || async {
                let left = count(cluster_api.clone(), &ListParams::default(), |_| true).await;
                n - left
            },
            model(&ws.ns, &clusters, &targeted, "v2", &hashes)
        );
    }

    // Idle after all of it: no write at all, no refusal in its log.
    let writes = settled("the hub's writes", Duration::from_secs(3), || hub.writes()).await;
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
    let refused = hub.refusals();
    assert!(refused.is_empty(), "RBAC refusals:\n{}", refused.join("\n"));
    for (phase, seen, total, took) in &figures {
        eprintln!(
            "[{}] N={n}: killed during {phase} at {seen}/{total}, exactly right {:.1} s later",
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
    let _serial = SERIAL.lock().await;
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
        agents.push(start_agent(&ws, cluster, downstream, AgentOpts::default()).await);
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
    hub.assert_running();
    let refused = hub.refusals();
    assert!(
        refused.is_empty(),
        "hub RBAC refusals:\n{}",
        refused.join("\n")
    );
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
    let _serial = SERIAL.lock().await;
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
    eventually(
        "the agent's re-list refused (403 in its log)",
        CONVERGE,
        || {
            let refused = !agent.refusals().is_empty();
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
        "[{}] agent refused for {:.0} s: nothing deleted; the rotation arrived {:.1} s after the \
         RoleBinding returned",
        ws.ns,
        window.as_secs_f64(),
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
    let _serial = SERIAL.lock().await;
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
    let takeover_writes = settled("the new leader's writes", Duration::from_secs(3), || {
        b.writes()
    })
    .await;
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
    let b_writes = settled("the new leader's writes", Duration::from_secs(3), || {
        b.writes()
    })
    .await;
    assert!(
        b_writes >= takeover_writes + 2 * n as u64,
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
    for r in [&a, &b] {
        let refused = r.refusals();
        assert!(
            refused.is_empty(),
            "{} refused:\n{}",
            r.name(),
            refused.join("\n")
        );
    }
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

// ---------------------------------------------------------------------------------------------
// 5. Every documented flag, chart value and the gate take effect in the binaries.

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
    let json = lines.iter().all(|l| l.starts_with('{'));
    let text = lines.iter().all(|l| !l.starts_with('{'));
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
    let _serial = SERIAL.lock().await;
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
        assert!(
            r.scrape().await.contains("tender_object_writes_total"),
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
         push probe noticed an outage after {:.1} s, AgentOffline after 4 s, log formats and levels",
        a_ws.ns,
        noticed.as_secs_f64()
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
    let _serial = SERIAL.lock().await;
    let env = OwnEnv::start(2).await;
    let ws = Workspace::without_hub(env.0, "flags-agent").await;
    let deployment = install_hub_chart(&ws.hub, &ws.ns, &[]).await;
    let _hub = Running::start(env.0, HUB, &deployment, "tender-hub-0", &[]).await;
    ws.source_secret("db-creds", &[("password", "v1")]).await;
    // Agent X: the chart's defaults. Agent Y: every value changed, and the flags the chart
    // does not expose.
    ws.cluster("x").await;
    ws.cluster("y").await;
    let mut x = start_agent(&ws, "x", &downstream_name(1), AgentOpts::default()).await;
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
        assert!(
            r.scrape().await.contains("tender_agent_heartbeats_total"),
            "{}",
            r.name()
        );
    }
}
