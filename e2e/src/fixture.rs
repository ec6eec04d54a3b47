//! Shared fixtures of the end-to-end tests: a [`Workspace`] (one test's namespace on the hub,
//! usually served by its own hub instance), its Clusters and in-process [`Agent`]s, source
//! objects and Bundles, and small waiting and object helpers.
//!
//! Every test builds its own workspace, so tests of one binary run in parallel on one shared
//! [`TestEnv`] without seeing each other's objects.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tender_agent::AgentConfig;
use tender_types::conditions::{TYPE_READY, is_true};
use tender_types::{Bundle, BundleDeployment, Cluster, labels, names};

use crate::agent_harness::{AgentHandle, start_agent_with};
use crate::hub_harness::{HubHandle, agent_kubeconfig, hub_config, start_hub};
use crate::proxy::WriteGate;
use crate::{ADMIN_USER, HUB, TestEnv, eventually, unique_name};

/// How long the fixtures wait for anything (a namespace provisioned, a BundleDeployment
/// Ready, a Secret changed) before failing the test.
pub const WAIT: Duration = Duration::from_secs(60);

/// How often the fixtures' agents re-check a deployment blocked by a conflict or an error
/// (`AgentConfig::conflict_recheck`, 30 s by default): the claim "untouched across two
/// re-checks" is about tender's own timer, so the tests shorten the timer, not the claim.
pub const TEST_CONFLICT_RECHECK: Duration = Duration::from_secs(3);

/// Longer than one of the fixtures' agents' conflict re-checks ([`TEST_CONFLICT_RECHECK`]): an
/// object tender must not touch is watched across a re-check made against the real apiserver,
/// not sampled once. That the re-checks recur on their timer and never write is proven
/// in-process on virtual time at the 30 s default (`crates/agent/src/testing/deploy_tests.rs`:
/// `a_conflict_is_reported_and_looked_at_again_only_after_the_recheck` and the adoption,
/// chart-retry and refusal tests next to it), so the window here needs only one.
pub const CONFLICT_RECHECKS: Duration = Duration::from_secs(4);

/// The field manager the fixtures apply source objects and Bundles with.
const FIELD_MANAGER: &str = "e2e";

/// One test's world: a workspace namespace on the hub cluster of a shared environment, and
/// (unless made [`without_hub`](Self::without_hub)) a hub instance serving only it.
pub struct Workspace {
    /// The environment the workspace lives in.
    pub env: &'static TestEnv,
    /// An admin client of the hub cluster.
    pub hub: kube::Client,
    /// The workspace namespace.
    pub ns: String,
    /// The namespace of the hub serving it, where its signing keys and rollout state are (the
    /// workspace itself unless made [`with_own_hub_namespace`](Self::with_own_hub_namespace)).
    pub hub_ns: String,
    hub_instance: Option<HubHandle>,
}

impl Workspace {
    /// A fresh workspace namespace named after `prefix` (CRDs installed), served by its own
    /// hub instance with the default test configuration ([`hub_config`]).
    pub async fn new(env: &'static TestEnv, prefix: &str) -> Self {
        let mut ws = Self::without_hub(env, prefix).await;
        ws.hub_instance = Some(start_hub(env, hub_config(&ws.ns)).await.unwrap());
        ws
    }

    /// Like [`new`](Self::new), the hub keeping its signing keys and rollout state in a
    /// namespace of its own (`<workspace>-hub`), as an installed hub does: for tests of what a
    /// user with rights in the workspace only can and cannot reach.
    pub async fn with_own_hub_namespace(env: &'static TestEnv, prefix: &str) -> Self {
        let mut ws = Self::without_hub(env, prefix).await;
        ws.hub_ns = format!("{}-hub", ws.ns);
        create_namespace(&ws.hub, &ws.hub_ns).await;
        let mut config = hub_config(&ws.ns);
        config.signing.namespace = ws.hub_ns.clone();
        ws.hub_instance = Some(start_hub(env, config).await.unwrap());
        ws
    }

    /// A fresh workspace namespace named after `prefix` (CRDs installed) that no hub serves:
    /// for tests that run their own hub(s).
    pub async fn without_hub(env: &'static TestEnv, prefix: &str) -> Self {
        let hub = env.client(HUB).await.unwrap();
        crate::crds::install_crds(&hub).await.unwrap();
        let ns = unique_name(prefix);
        create_namespace(&hub, &ns).await;
        Self {
            env,
            hub,
            hub_ns: ns.clone(),
            ns,
            hub_instance: None,
        }
    }

    /// The hub instance serving this workspace.
    ///
    /// # Panics
    /// For a workspace made [`without_hub`](Self::without_hub).
    pub fn hub_instance(&self) -> &HubHandle {
        self.hub_instance
            .as_ref()
            .expect("a workspace served by its own hub")
    }

    /// The hub namespace of Cluster `cluster` of this workspace.
    pub fn cluster_ns(&self, cluster: &str) -> String {
        names::cluster_namespace(&self.ns, cluster)
    }

    /// An admin client of cluster `name` of the environment (a downstream, or the hub).
    pub async fn downstream(&self, name: &str) -> kube::Client {
        self.env.client(name).await.unwrap()
    }

    /// Creates Cluster `name` (labelled `env: test`) and waits until the hub has provisioned
    /// its namespace.
    pub async fn cluster(&self, name: &str) {
        self.cluster_with_spec(name, json!({})).await;
    }

    /// Creates Cluster `name` (label `env=test`) with `spec` in the workspace and waits for
    /// its namespace.
    pub async fn cluster_with_spec(&self, name: &str, spec: Value) {
        self.cluster_labelled(name, &[], spec).await;
    }

    /// Like [`cluster_with_spec`](Self::cluster_with_spec), with `labels` besides `env=test`.
    pub async fn cluster_labelled(&self, name: &str, labels: &[(&str, &str)], spec: Value) {
        let clusters: Api<Cluster> = Api::namespaced(self.hub.clone(), &self.ns);
        let mut all = BTreeMap::from([("env".to_string(), "test".to_string())]);
        all.extend(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let cluster: Cluster = serde_json::from_value(json!({
            "apiVersion": "tender.dev/v1alpha1", "kind": "Cluster",
            "metadata": {"name": name, "labels": all},
            "spec": spec
        }))
        .unwrap();
        clusters
            .create(&PostParams::default(), &cluster)
            .await
            .unwrap();
        eventually(
            &format!("Cluster {name} namespace provisioned"),
            WAIT,
            || async {
                let c = clusters.get(name).await?;
                Ok::<_, kube::Error>(c.status.and_then(|s| s.namespace).map(|_| ()))
            },
        )
        .await;
    }

    /// Registers Cluster `name` ([`cluster`](Self::cluster)) and waits for its agent token;
    /// returns the agent's hub kubeconfig (its narrow identity) and an agent configuration
    /// with a 2 s heartbeat.
    pub async fn register(&self, name: &str) -> (String, AgentConfig) {
        self.register_labelled(name, &[]).await
    }

    /// Like [`register`](Self::register), the Cluster labelled `labels` besides `env=test`.
    pub async fn register_labelled(
        &self,
        name: &str,
        labels: &[(&str, &str)],
    ) -> (String, AgentConfig) {
        self.cluster_labelled(name, labels, json!({})).await;
        let kubeconfig = agent_kubeconfig(self.env, &self.hub, &self.ns, name)
            .await
            .unwrap();
        let mut config = AgentConfig::new(&self.ns, name);
        // The in-process hub's key Secret is in the workspace; a hub binary started from the
        // chart keeps its own in its release namespace.
        config.hub_signing_keys = if self.hub_instance.is_some() {
            crate::hub_harness::hub_signing_keys(&self.hub, &self.hub_ns).await
        } else {
            crate::hub_harness::test_hub_signing_keys(&self.hub, &self.ns).await
        };
        config.heartbeat_interval = Duration::from_secs(2);
        config.cluster_status_interval = Duration::from_secs(300);
        config.conflict_recheck = TEST_CONFLICT_RECHECK;
        (kubeconfig, config)
    }

    /// Registers `cluster` and starts its agent against cluster `downstream` of the
    /// environment.
    pub async fn agent(&self, cluster: &str, downstream: &str) -> Agent {
        let down = self.env.kubeconfig_as(downstream, ADMIN_USER);
        self.agent_with(cluster, downstream, down).await
    }

    /// Like [`agent`](Self::agent), but the agent reaches `downstream` only through `gate`
    /// (restarts too), which a test can make hold the agent's downstream writes.
    pub async fn agent_through(&self, cluster: &str, downstream: &str, gate: &WriteGate) -> Agent {
        let server = &self.env.cluster(downstream).server;
        let down = gate.rewrite_kubeconfig(&self.env.kubeconfig_as(downstream, ADMIN_USER), server);
        self.agent_with(cluster, downstream, down).await
    }

    /// An agent that renders charts: the pinned Helm (built on first use) and a chart cache
    /// of its own.
    pub async fn helm_agent(&self, cluster: &str, downstream: &str) -> Agent {
        let helm = crate::ensure_helm().expect("building helm");
        let cache = std::env::temp_dir().join(unique_name("tender-chart-cache"));
        self.agent_configured(cluster, downstream, |c| {
            c.helm_path = helm;
            c.chart_cache_dir = cache;
        })
        .await
    }

    /// Like [`agent`](Self::agent), with `configure` applied to the agent's configuration
    /// (e.g. the helm binary).
    pub async fn agent_configured(
        &self,
        cluster: &str,
        downstream: &str,
        configure: impl FnOnce(&mut AgentConfig),
    ) -> Agent {
        let down = self.env.kubeconfig_as(downstream, ADMIN_USER);
        let (kubeconfig, mut config) = self.register(cluster).await;
        configure(&mut config);
        launch(kubeconfig, down, config, downstream).await
    }

    /// Like [`agent`](Self::agent), the Cluster labelled `labels` (e.g. its hub shard).
    pub async fn agent_labelled(
        &self,
        cluster: &str,
        downstream: &str,
        labels: &[(&str, &str)],
    ) -> Agent {
        let down = self.env.kubeconfig_as(downstream, ADMIN_USER);
        let (kubeconfig, config) = self.register_labelled(cluster, labels).await;
        launch(kubeconfig, down, config, downstream).await
    }

    async fn agent_with(&self, cluster: &str, downstream: &str, down: String) -> Agent {
        let (kubeconfig, config) = self.register(cluster).await;
        launch(kubeconfig, down, config, downstream).await
    }

    /// Creates or replaces source Secret `name` in the workspace: [`secret`] with `data`,
    /// labelled `team: payments` and annotated `owner: dba`.
    pub async fn source_secret(&self, name: &str, data: &[(&str, &str)]) {
        self.apply_source_secret(name, data, false).await;
    }

    /// Like [`source_secret`](Self::source_secret), but the Secret is immutable.
    pub async fn source_secret_immutable(&self, name: &str, data: &[(&str, &str)]) {
        self.apply_source_secret(name, data, true).await;
    }

    async fn apply_source_secret(&self, name: &str, data: &[(&str, &str)], immutable: bool) {
        let mut s = secret(name, data);
        s.metadata.labels = Some(BTreeMap::from([("team".into(), "payments".into())]));
        s.metadata.annotations = Some(BTreeMap::from([("owner".into(), "dba".into())]));
        s.immutable = immutable.then_some(true);
        Api::<Secret>::namespaced(self.hub.clone(), &self.ns)
            .patch(name, &apply(), &Patch::Apply(&s))
            .await
            .unwrap();
    }

    /// Creates or replaces source ConfigMap `name` in the workspace with `data`.
    pub async fn source_config_map(&self, name: &str, data: &[(&str, &str)]) {
        Api::<ConfigMap>::namespaced(self.hub.clone(), &self.ns)
            .patch(name, &apply(), &Patch::Apply(&config_map(name, data)))
            .await
            .unwrap();
    }

    /// Creates or replaces Bundle `name` with `spec`.
    pub async fn bundle(&self, name: &str, spec: Value) {
        let body = json!({
            "apiVersion": "tender.dev/v1alpha1", "kind": "Bundle",
            "metadata": {"name": name}, "spec": spec
        });
        Api::<Bundle>::namespaced(self.hub.clone(), &self.ns)
            .patch(name, &apply(), &Patch::Apply(body))
            .await
            .unwrap();
    }

    /// Deletes Bundle `name` (without waiting for it to go).
    pub async fn delete_bundle(&self, name: &str) {
        Api::<Bundle>::namespaced(self.hub.clone(), &self.ns)
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    /// The BundleDeployments of Cluster `cluster`.
    pub fn bds(&self, cluster: &str) -> Api<BundleDeployment> {
        Api::namespaced(self.hub.clone(), &self.cluster_ns(cluster))
    }

    /// Waits until `bundle`'s BundleDeployment on `cluster` is applied at its deploymentID; on
    /// timeout, fails naming `what` with the BundleDeployment's status (what the agent said)
    /// and the Bundle's conditions.
    pub async fn wait_applied(&self, cluster: &str, bundle: &str, what: &str) {
        let bds = self.bds(cluster);
        let applied = crate::within(WAIT, || async {
            bds.get_opt(bundle).await.ok().flatten().is_some_and(|bd| {
                bd.status.as_ref().is_some_and(|s| {
                    s.applied_deployment_id.as_deref() == Some(&bd.spec.deployment_id)
                })
            })
        })
        .await;
        if !applied {
            let bd = bds.get_opt(bundle).await.unwrap();
            let b = Api::<Bundle>::namespaced(self.hub.clone(), &self.ns)
                .get_opt(bundle)
                .await
                .unwrap();
            eprintln!(
                "Bundle {bundle}: {:#?}",
                b.and_then(|b| b.status).map(|s| s.conditions)
            );
            panic!(
                "{what} on {cluster}: not applied: {:#?}",
                bd.map(|b| b.status)
            );
        }
    }

    /// Waits until the BundleDeployment of `bundle` on `cluster` is Ready with its current
    /// deploymentID applied — and, with copies, the copies the hub holds now
    /// (`appliedCopiesID`, decision 0089-signed-copies), as the hub judges it.
    pub async fn ready(&self, cluster: &str, bundle: &str) -> BundleDeployment {
        let api = self.bds(cluster);
        let ns = self.cluster_ns(cluster);
        eventually(
            &format!("BundleDeployment {bundle} of {cluster} Ready and applied"),
            WAIT,
            || async {
                let Some(bd) = api.get_opt(bundle).await? else {
                    return Ok(None);
                };
                let expected = self.expected_copies_id(&ns, &bd).await?;
                let done = bd.status.as_ref().is_some_and(|s| {
                    s.applied_deployment_id.as_deref() == Some(&bd.spec.deployment_id)
                        && (expected.is_none()
                            || s.applied_copies_id.is_none()
                            || s.applied_copies_id == expected)
                        && is_true(&s.conditions, TYPE_READY)
                });
                Ok::<_, kube::Error>(done.then_some(bd))
            },
        )
        .await
    }

    /// The effective deployment of `bd` with the copies the hub holds in `ns` now (`None`
    /// without copies; `Some("")` while one is missing).
    async fn expected_copies_id(
        &self,
        ns: &str,
        bd: &BundleDeployment,
    ) -> Result<Option<String>, kube::Error> {
        let entries = &bd.spec.options.downstream_resources;
        if entries.is_empty() {
            return Ok(None);
        }
        let mut hashes = Vec::new();
        for e in entries {
            let annotations = if e.kind == "ConfigMap" && !e.is_carried() {
                Api::<ConfigMap>::namespaced(self.hub.clone(), ns)
                    .get_opt(&e.copy_name)
                    .await?
                    .and_then(|c| c.metadata.annotations)
            } else {
                Api::<Secret>::namespaced(self.hub.clone(), ns)
                    .get_opt(&e.copy_name)
                    .await?
                    .and_then(|c| c.metadata.annotations)
            };
            let Some(hash) = annotations.and_then(|a| a.get(labels::CONTENT_HASH).cloned()) else {
                return Ok(Some(String::new()));
            };
            hashes.push((e.copy_name.clone(), hash));
        }
        Ok(Some(tender_types::hash::effective_deployment_id(
            &bd.spec.deployment_id,
            hashes.iter().map(|(c, h)| (c.as_str(), h.as_str())),
        )))
    }
}

/// Starts a registered Cluster's agent with its hub kubeconfig, its downstream kubeconfig
/// `down` (for cluster `downstream` of the environment) and `config`.
async fn launch(kubeconfig: String, down: String, config: AgentConfig, downstream: &str) -> Agent {
    let handle = start_agent_with(&kubeconfig, &down, config.clone())
        .await
        .unwrap();
    Agent {
        kubeconfig,
        downstream_kubeconfig: down,
        config,
        downstream: downstream.to_string(),
        handle: Some(handle),
    }
}

/// A registered Cluster with its in-process agent, which a test may kill and restart.
/// Dropping it kills the agent.
pub struct Agent {
    kubeconfig: String,
    downstream_kubeconfig: String,
    config: AgentConfig,
    /// The environment's cluster the agent deploys to.
    pub downstream: String,
    handle: Option<AgentHandle>,
}

impl Agent {
    /// Kills the agent like a crashed process (no-op when it is not running).
    pub async fn kill(&mut self) {
        if let Some(h) = self.handle.take() {
            h.kill().await;
        }
    }

    /// Kills the agent if it runs and starts it again, same identity, configuration and way
    /// to its downstream cluster.
    pub async fn restart(&mut self) {
        self.kill().await;
        self.handle = Some(
            start_agent_with(
                &self.kubeconfig,
                &self.downstream_kubeconfig,
                self.config.clone(),
            )
            .await
            .unwrap(),
        );
    }

    /// The running agent.
    ///
    /// # Panics
    /// When the agent has been killed and not restarted.
    pub fn handle(&self) -> &AgentHandle {
        self.handle.as_ref().expect("agent running")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            drop(tokio::spawn(h.kill()));
        }
    }
}

/// The spec of a Bundle deployed to `clusters` (by name) in `target_ns`: copies of source
/// Secret `db-creds` and ConfigMap `app-config`, and a ConfigMap manifest `app-settings` that
/// refers to both.
pub fn app_bundle(clusters: &[&str], target_ns: &str) -> Value {
    json!({
        "targets": clusters.iter().map(|c| json!({"clusterName": c})).collect::<Vec<_>>(),
        "defaultNamespace": target_ns,
        "downstreamResources": [
            {"kind": "Secret", "name": "db-creds"},
            {"kind": "ConfigMap", "name": "app-config"}
        ],
        "resources": [{
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "app-settings"},
            "data": {"secretRef": "db-creds", "configRef": "app-config"}
        }],
    })
}

fn apply() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// Secret data from string pairs.
pub fn bytes(data: &[(&str, &str)]) -> BTreeMap<String, ByteString> {
    data.iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect()
}

/// An Opaque Secret `name` with `data`.
pub fn secret(name: &str, data: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(bytes(data)),
        ..Default::default()
    }
}

/// A ConfigMap `name` with `data`.
pub fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Default::default()
    }
}

/// Value `key` of Secret `s` as UTF-8, if present.
pub fn secret_value(s: &Secret, key: &str) -> Option<String> {
    String::from_utf8(s.data.as_ref()?.get(key)?.0.clone()).ok()
}

/// Creates namespace `name` through `client` (fine when it exists already).
pub async fn create_namespace(client: &kube::Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating namespace {name}: {e}"),
    }
}

/// Identity of every downstream object of one cluster namespace (copies, manifests and the
/// agent's inventories, found by tender's cluster-namespace label): `Kind ns/name` → (uid,
/// resourceVersion).
pub type Snapshot = BTreeMap<String, (String, String)>;

/// The [`Snapshot`] of cluster namespace `cluster_ns`'s objects on the downstream cluster of
/// `down`.
pub async fn snapshot(down: &kube::Client, cluster_ns: &str) -> kube::Result<Snapshot> {
    let lp = ListParams::default().labels(&format!("{}={cluster_ns}", labels::CLUSTER_NAMESPACE));
    let mut out = Snapshot::new();
    let id = |kind: &str, m: &ObjectMeta| {
        (
            format!(
                "{kind} {}/{}",
                m.namespace.as_deref().unwrap_or_default(),
                m.name.as_deref().unwrap_or_default()
            ),
            (
                m.uid.clone().unwrap_or_default(),
                m.resource_version.clone().unwrap_or_default(),
            ),
        )
    };
    for s in Api::<Secret>::all(down.clone()).list_metadata(&lp).await? {
        let (k, v) = id("Secret", &s.metadata);
        out.insert(k, v);
    }
    for c in Api::<ConfigMap>::all(down.clone())
        .list_metadata(&lp)
        .await?
    {
        let (k, v) = id("ConfigMap", &c.metadata);
        out.insert(k, v);
    }
    Ok(out)
}

/// Waits until Secret `ns/name` exists in `client`'s cluster and `check` holds for it; `what`
/// names the wait in the failure message.
pub async fn wait_secret(
    client: &kube::Client,
    ns: &str,
    name: &str,
    what: &str,
    check: impl Fn(&Secret) -> bool,
) -> Secret {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    eventually(what, WAIT, || async {
        Ok::<_, kube::Error>(api.get_opt(name).await?.filter(|s| check(s)))
    })
    .await
}

/// Waits until `sample` has kept one value for `quiet` (polled every 250 ms; at most [`WAIT`]),
/// e.g. a write counter after a burst of work; returns that value. `what` names the wait in the
/// failure message.
pub async fn settled<T, F, Fut>(what: &str, quiet: Duration, mut sample: F) -> T
where
    T: PartialEq + Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = T>,
{
    let deadline = Instant::now() + WAIT;
    let mut last = sample().await;
    let mut since = Instant::now();
    while since.elapsed() < quiet {
        assert!(
            Instant::now() < deadline,
            "{what} did not settle within {WAIT:?} (still changing: {last:?})"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = sample().await;
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    last
}

/// Observes `sample` across `window` (at its start, every 500 ms and at its end) and fails
/// at the first sample that is not `expected`: "nothing happened" as an assertion that can
/// fail, not a sleep. `what` names the observation in the failure message.
pub async fn stays<T, F, Fut>(what: &str, window: Duration, expected: &T, mut sample: F)
where
    T: PartialEq + Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = T>,
{
    let start = Instant::now();
    let mut samples = 0;
    loop {
        let now = sample().await;
        samples += 1;
        assert_eq!(
            &now,
            expected,
            "{what}: changed {:?} into the {window:?} observation window",
            start.elapsed()
        );
        let left = window.saturating_sub(start.elapsed());
        if left.is_zero() {
            break;
        }
        tokio::time::sleep(left.min(Duration::from_millis(500))).await;
    }
    assert!(samples >= 2, "{what}: observed only {samples} time(s)");
}

/// The log lines of tender's crates and kube (at debug) while a [`LogCapture`] is alive, for
/// the searches that prove no Secret value or credential is ever logged. Every test of the
/// binary logs through the one process-wide subscriber, so the capture holds other tests' lines
/// too (a superset: the values searched for are unique to the test); outside captures the
/// filter is off, so the rest of the suite neither formats nor keeps debug lines.
pub fn capture_logs() -> LogCapture {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, reload};
    const CAPTURED: &str = "tender_hub=debug,tender_agent=debug,tender_runtime=debug,kube=debug";
    let state = LOG_CAPTURE.get_or_init(|| {
        struct Sink;
        impl std::io::Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                if let Some(state) = LOG_CAPTURE.get() {
                    state.lines.lock().unwrap().extend_from_slice(buf);
                }
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let (filter, handle) = reload::Layer::new(EnvFilter::new("off"));
        let _ = tracing_subscriber::registry()
            .with(filter)
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(|| Sink)
                    .with_ansi(false),
            )
            .try_init();
        CaptureState {
            lines: std::sync::Mutex::new(Vec::new()),
            open: std::sync::Mutex::new(0),
            filter: Box::new(move |on| {
                let _ = handle.reload(EnvFilter::new(if on { CAPTURED } else { "off" }));
            }),
        }
    });
    let mut open = state.open.lock().unwrap();
    if *open == 0 {
        (state.filter)(true);
    }
    *open += 1;
    LogCapture(state)
}

struct CaptureState {
    lines: std::sync::Mutex<Vec<u8>>,
    /// Captures alive; the filter is on while there is one.
    open: std::sync::Mutex<usize>,
    filter: Box<dyn Fn(bool) + Send + Sync>,
}

static LOG_CAPTURE: std::sync::OnceLock<CaptureState> = std::sync::OnceLock::new();

/// Log capture of one test (see [`capture_logs`]); ends when dropped.
pub struct LogCapture(&'static CaptureState);

impl LogCapture {
    /// Everything captured so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lines.lock().unwrap()).into_owned()
    }
}

impl Drop for LogCapture {
    fn drop(&mut self) {
        let mut open = self.0.open.lock().unwrap();
        *open -= 1;
        if *open == 0 {
            (self.0.filter)(false);
        }
    }
}
