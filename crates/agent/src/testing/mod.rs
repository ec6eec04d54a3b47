//! The agent in-process, for tests: its [`Context`] over two fake apiservers (the hub and the
//! downstream cluster, [`fake::Fake`]), its caches filled from them by the same reflectors
//! `run` starts, and its BundleDeployment controller wired as `run` wires it — on tokio's
//! clock, so a test on the paused clock (`#[tokio::test(start_paused = true)]`) waits out the
//! agent's timers (conflict re-check, chart retry, hook poll) in virtual time.
//!
//! Tests drive it through its entry points only (the controller, `deploy::deploy`,
//! `reconcile::reconcile`) and assert the requests the fakes recorded.

pub(crate) mod fake;

mod deploy_tests;
mod files_tests;
mod removal_tests;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use kube::Resource;
use kube::api::ApiResource;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::{self, ObjectRef as KubeRef};
use kube::runtime::{PredicateConfig, WatchStreamExt, watcher};
use ring::rand::SystemRandom;
use ring::signature::Ed25519KeyPair;
use serde_json::{Value, json};
use tender_types::signing::{CopyClaim, HubKey, TrustedKeys};
use tender_types::{BundleDeployment, Cluster, hash, labels};
use tokio::task::JoinSet;

use crate::config::AgentConfig;
use crate::context::Context;
use crate::plan::Owner;
use crate::{AgentMetrics, copies, namespaces};

use fake::Fake;
use tender_runtime::fake::Recorded;

/// The workspace and Cluster of the agent under test.
pub(crate) const WORKSPACE: &str = "ws";
pub(crate) const CLUSTER: &str = "east";
/// The namespace a test's Bundle deploys into downstream.
pub(crate) const TARGET: &str = "app";

fn erase<K: Resource<DynamicType = ()>>() -> ApiResource {
    ApiResource::erase::<K>(&())
}

/// What the hub serves to an agent.
fn hub_kinds() -> Vec<(ApiResource, bool)> {
    vec![
        (erase::<BundleDeployment>(), true),
        (erase::<Cluster>(), true),
        (erase::<Secret>(), true),
        (erase::<ConfigMap>(), true),
        (erase::<Event>(), true),
        (erase::<Lease>(), true),
        (erase::<Namespace>(), false),
    ]
}

/// What the downstream cluster serves.
fn downstream_kinds() -> Vec<(ApiResource, bool)> {
    vec![
        (erase::<Namespace>(), false),
        (erase::<Secret>(), true),
        (erase::<ConfigMap>(), true),
        (erase::<ServiceAccount>(), true),
        (erase::<Pod>(), true),
        (erase::<Job>(), true),
        (erase::<Deployment>(), true),
        (erase::<Event>(), true),
    ]
}

/// One agent over two fakes.
pub(crate) struct Agent {
    pub(crate) hub: Fake,
    pub(crate) down: Fake,
    pub(crate) ctx: Arc<Context>,
    key: HubKey,
    /// The controller and the reflectors (aborted when the agent is dropped).
    tasks: JoinSet<()>,
    controller: Option<Controlled>,
}

/// What the controller needs that the context does not hold.
struct Controlled {
    triggers: mpsc::UnboundedReceiver<KubeRef<BundleDeployment>>,
    trigger: mpsc::UnboundedSender<KubeRef<BundleDeployment>>,
    feeds: copies::CopyFeeds,
}

impl Agent {
    /// An agent for Cluster `east` with the default configuration changed by `tune`; its
    /// downstream caches (namespaces, Secrets, ConfigMaps) are filled before this returns.
    pub(crate) async fn new(tune: impl FnOnce(&mut AgentConfig)) -> Self {
        let hub = Fake::new(&hub_kinds());
        let down = Fake::new(&downstream_kinds());
        let key = {
            let doc = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).expect("key");
            HubKey::from_pkcs8(doc.as_ref()).expect("key")
        };
        let mut config = AgentConfig::new(WORKSPACE, CLUSTER);
        config.hub_signing_keys = key.public_key();
        tune(&mut config);
        let ns = config.cluster_namespace.clone();
        let registered = TrustedKeys::parse(&config.hub_signing_keys).expect("keys");
        let (hub_copies, feeds) = copies::stores(hub.client(&ns), &ns, registered);
        let (trigger, triggers) = mpsc::unbounded();
        let (namespaces, namespace_writer) = namespaces::store();
        let ctx = Arc::new(Context::new(
            hub.client(&ns),
            down.client("default"),
            config,
            AgentMetrics::register(tender_runtime::Metrics::new()),
            hub_copies,
            namespaces.clone(),
            trigger.clone(),
        ));
        let mut tasks = JoinSet::new();
        let (bds, _) = reflector::store::<BundleDeployment>();
        tasks.spawn(namespaces::feed(
            down.client("default"),
            namespace_writer,
            bds,
            trigger.clone(),
        ));
        namespaces
            .wait_until_ready()
            .await
            .expect("namespaces listed");
        for kind in ["Secret", "ConfigMap"] {
            let (resource, _) = ctx.down.resolve("v1", kind).await.expect("discovery");
            ctx.drift.ensure(&resource);
        }
        let agent = Self {
            hub,
            down,
            ctx,
            key,
            tasks,
            controller: Some(Controlled {
                triggers,
                trigger,
                feeds,
            }),
        };
        agent.settle().await;
        agent
    }

    /// Starts the BundleDeployment controller and the hub's copy reflectors, as `run` does.
    pub(crate) fn start(&mut self) {
        let Controlled {
            triggers,
            trigger,
            feeds,
        } = self.controller.take().expect("started once");
        let (store, writer) = reflector::store();
        let stream = reflector::reflector(
            writer,
            tender_runtime::watch::watcher(self.ctx.bds.clone(), watcher::Config::default()),
        )
        .applied_objects()
        .predicate_filter(crate::run::beyond_status, PredicateConfig::default());
        let controller = Controller::for_stream(stream, store).reconcile_on(triggers);
        feeds.spawn(controller.store(), trigger, &mut self.tasks);
        let ctx = self.ctx.clone();
        self.tasks.spawn(
            controller
                .run(
                    crate::reconcile::reconcile,
                    crate::reconcile::error_policy,
                    ctx,
                )
                .for_each(|_| async {}),
        );
    }

    /// Lets every task run for `d` of the (paused) clock.
    pub(crate) async fn run_for(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }

    /// Lets every task run until nothing is left to do soon (100 ms of the clock).
    pub(crate) async fn settle(&self) {
        self.run_for(Duration::from_millis(100)).await;
    }

    /// The cluster namespace on the hub.
    pub(crate) fn cluster_namespace(&self) -> String {
        self.ctx.config.cluster_namespace.clone()
    }

    /// The owner annotation of BundleDeployment `bd`.
    pub(crate) fn owner(&self, bd: &str) -> String {
        Owner::new(&self.cluster_namespace(), bd).annotation()
    }

    /// Puts BundleDeployment `name` on the hub with `spec` (JSON), as the hub writes it.
    pub(crate) fn put_bd(&self, name: &str, spec: Value) -> BundleDeployment {
        let stored = self.hub.put(json!({
            "apiVersion": tender_types::API_GROUP_VERSION,
            "kind": "BundleDeployment",
            "metadata": {"name": name, "namespace": self.cluster_namespace(), "generation": 1},
            "spec": spec,
        }));
        serde_json::from_value(stored).expect("a BundleDeployment")
    }

    /// BundleDeployment `name` as the hub holds it now.
    pub(crate) fn bd(&self, name: &str) -> BundleDeployment {
        let stored = self
            .hub
            .get(
                tender_types::API_GROUP_VERSION,
                "BundleDeployment",
                Some(&self.cluster_namespace()),
                name,
            )
            .expect("the BundleDeployment");
        serde_json::from_value(stored).expect("a BundleDeployment")
    }

    /// The hub's signed copy `copy_name` of Secret `name` for BundleDeployment `bd`.
    pub(crate) fn put_copy(&self, bd: &str, name: &str, copy_name: &str, data: &[(&str, &str)]) {
        let ns = self.cluster_namespace();
        let data: serde_json::Map<String, Value> = data
            .iter()
            .map(|(k, v)| {
                let encoded = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, v);
                (k.to_string(), json!(encoded))
            })
            .collect();
        let body = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": copy_name, "namespace": ns},
            "data": data,
        });
        let secret: Secret = serde_json::from_value(body.clone()).expect("a Secret");
        let content_hash = hash::secret_hash(&secret);
        let signature = self.key.sign(&CopyClaim {
            cluster_namespace: &ns,
            bundle_deployment: bd,
            api_version: "v1",
            kind: "Secret",
            name,
            copy_name,
            content_hash: &content_hash,
            signed_at: 7,
        });
        let mut body = body;
        body["metadata"]["annotations"] = json!({ labels::HUB_SIGNATURE: signature });
        self.hub.put(body);
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.tasks.abort_all();
    }
}

/// The writes of `requests` as `METHOD path` lines, without the reads.
pub(crate) fn lines(requests: &[Recorded]) -> Vec<String> {
    requests.iter().map(Recorded::to_string).collect()
}

/// The writes of `requests` to objects under `path` (a collection or an object).
pub(crate) fn writes_to<'a>(requests: &'a [Recorded], path: &str) -> Vec<&'a Recorded> {
    requests
        .iter()
        .filter(|r| r.is_write() && r.path.starts_with(path))
        .collect()
}
