//! Push mode: for each Cluster with `spec.kubeconfigSecretRef`, the hub runs the agent itself,
//! with its own client as the agent's hub client and a client built from the Secret's
//! kubeconfig as the downstream one. One code path, two ways to reach a cluster.
//!
//! This library does not link the agent (decision 0084-hub-library-without-the-agent): whoever
//! embeds the hub hands it a [`PushRunner`] in [`PushConfig::runner`] — the `tender-hub` binary's
//! runs `tender_agent::run` — and the hub calls it with the [`PushAgent`] it decided on.
//!
//! The Cluster reconciler drives it: it observes the Secret's metadata in the source cache,
//! [`step`] (pure) decides whether the running task still matches, and [`Push::ensure`]
//! carries the decision out — reading the Secret's content with one GET only when its
//! resourceVersion moved. Each push cluster runs in its own task: a probe of the downstream
//! (`/version`, then a GET of the agent namespace) every `probe_interval` with a timeout
//! reports [`PushState`], starts the agent when the cluster answers and stops it (dropping
//! it, deleting nothing) when it does not. State changes wake the Cluster reconciler, which
//! writes them as the `ClusterConnected` condition.

pub mod kubeconfig;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc::UnboundedSender;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use tender_types::conditions::reason;
use tender_types::{Cluster, ClusterSpec};
use tokio::task::JoinHandle;

pub use kubeconfig::{Problem, Timeouts};

use crate::Error;

/// Default of [`PushConfig::heartbeat_interval`] (the agent's own default).
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(30);

/// What the hub decided for one push cluster's agent; the [`PushRunner`] adds the settings
/// that are the agent's own (chart limits, cache directory, metrics).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushAgent {
    /// The Cluster's workspace namespace.
    pub workspace: String,
    /// The Cluster's name.
    pub cluster: String,
    /// The agent namespace downstream (`spec.agentNamespace`).
    pub agent_namespace: String,
    /// The copy feature gate, as the hub reads it.
    pub copy_resources_downstream: bool,
    /// The agent's identity on its Lease and Events (`<hub instance>/push`).
    pub identity: String,
    /// Lease renewal interval.
    pub heartbeat_interval: Duration,
    /// The hub's public signing keys, comma-separated (the agent verifies copies with them).
    pub hub_signing_keys: String,
}

/// Runs one push cluster's agent: `hub` is the hub's own client, `downstream` the one built
/// from the Cluster's kubeconfig. The future ends only when the agent fails (it is restarted
/// at the next successful probe) and is dropped to stop the agent.
pub trait PushRunner: Send + Sync {
    /// Starts the agent described by `agent`.
    fn run(
        &self,
        hub: Client,
        downstream: Client,
        agent: PushAgent,
    ) -> BoxFuture<'static, anyhow::Result<()>>;
}

/// A shared [`PushRunner`] (what [`PushConfig::runner`] holds).
#[derive(Clone)]
pub struct Runner(pub Arc<dyn PushRunner>);

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Runner(..)")
    }
}

/// Push-mode settings of a hub.
#[derive(Clone, Debug)]
pub struct PushConfig {
    /// Accept kubeconfigs with an exec plugin or auth-provider (`--allow-kubeconfig-exec`).
    pub allow_kubeconfig_exec: bool,
    /// How often each push cluster is probed.
    pub probe_interval: Duration,
    /// How long a probe may take before the cluster is `ClusterUnreachable`.
    pub probe_timeout: Duration,
    /// Client timeouts of the downstream clients.
    pub timeouts: Timeouts,
    /// Lease renewal interval of the in-hub agents.
    pub heartbeat_interval: Duration,
    /// Runs the in-hub agents. `None`: this process runs none, and every push cluster reports
    /// `ClusterUnreachable` saying so (the `tender-hub` binary always sets one).
    pub runner: Option<Runner>,
}

impl Default for PushConfig {
    fn default() -> Self {
        Self {
            allow_kubeconfig_exec: false,
            probe_interval: Duration::from_secs(30),
            probe_timeout: Duration::from_secs(10),
            timeouts: Timeouts::default(),
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            runner: None,
        }
    }
}

/// How the hub's connection to a push cluster stands. Messages never hold kubeconfig content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PushState {
    /// The kubeconfig was loaded; the first probe is under way.
    Connecting,
    /// The cluster answers with the kubeconfig's identity; its agent runs.
    Connected,
    /// The Secret or its key does not exist.
    KubeconfigMissing(String),
    /// The kubeconfig cannot be used.
    KubeconfigInvalid(String),
    /// The kubeconfig would run a command and the hub does not allow it.
    ExecNotAllowed(String),
    /// The cluster refuses the identity (401/403).
    Refused(String),
    /// The cluster does not answer (in time).
    Unreachable(String),
}

impl PushState {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Connecting => reason::CONNECTING,
            Self::Connected => reason::CLUSTER_CONNECTED,
            Self::KubeconfigMissing(_) => reason::KUBECONFIG_MISSING,
            Self::KubeconfigInvalid(_) => reason::KUBECONFIG_INVALID,
            Self::ExecNotAllowed(_) => reason::KUBECONFIG_EXEC_NOT_ALLOWED,
            Self::Refused(_) => reason::KUBECONFIG_REFUSED,
            Self::Unreachable(_) => reason::CLUSTER_UNREACHABLE,
        }
    }

    /// The condition message.
    pub fn message(&self) -> String {
        match self {
            Self::Connecting => "kubeconfig loaded; probing the cluster".to_string(),
            Self::Connected => "the hub reaches the cluster with its kubeconfig".to_string(),
            Self::KubeconfigMissing(m)
            | Self::KubeconfigInvalid(m)
            | Self::ExecNotAllowed(m)
            | Self::Refused(m)
            | Self::Unreachable(m) => m.clone(),
        }
    }

    /// Whether the cluster answers.
    pub fn is_connected(&self) -> bool {
        matches!(self, Self::Connected)
    }
}

/// The Secret version a push task was started from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Source {
    /// Secret name (in the Cluster's namespace).
    pub secret: String,
    /// Key of the kubeconfig in it.
    pub key: String,
    /// The Secret's resourceVersion.
    pub resource_version: String,
}

/// What to do about a Cluster's push task. Pure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Pull mode or being deleted: no task.
    Stop,
    /// The Secret is not in the cache: no task, reported missing.
    Missing(String),
    /// The task (or the problem recorded) is of this very Secret version: nothing to do.
    Keep,
    /// Read this Secret version (one GET) and (re)start the task with it.
    Load(Source),
}

/// Decides from the Cluster's spec, whether it is being deleted, the cached resourceVersion of
/// the Secret it names and the source of what runs now.
pub fn step(
    spec: &ClusterSpec,
    deleting: bool,
    cached_version: Option<&str>,
    current: Option<&Source>,
) -> Step {
    let Some(r) = spec.kubeconfig_secret_ref.as_ref().filter(|_| !deleting) else {
        return Step::Stop;
    };
    let Some(version) = cached_version else {
        return Step::Missing(format!(
            "Secret {:?} (kubeconfigSecretRef) does not exist",
            r.name
        ));
    };
    let wanted = Source {
        secret: r.name.clone(),
        key: r.key().to_string(),
        resource_version: version.to_string(),
    };
    if current == Some(&wanted) {
        Step::Keep
    } else {
        Step::Load(wanted)
    }
}

/// Aborts its task when dropped: a push task never outlives its entry.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Entry {
    source: Source,
    /// `None` when the Secret's content was refused (the problem is in `states`).
    _task: Option<AbortOnDrop>,
}

/// The push tasks of one scope, their states, and the channel that wakes the Cluster
/// reconciler when a state changes.
pub(crate) struct Push {
    hub: Client,
    config: PushConfig,
    copy: bool,
    instance: String,
    /// The hub's public signing keys handed to every push agent.
    pub(crate) signing_keys: String,
    notify: UnboundedSender<ObjectRef<Cluster>>,
    entries: Mutex<HashMap<ObjectRef<Cluster>, Entry>>,
    states: Arc<Mutex<HashMap<ObjectRef<Cluster>, PushState>>>,
}

impl Push {
    pub(crate) fn new(
        hub: Client,
        config: PushConfig,
        copy: bool,
        instance: String,
        notify: UnboundedSender<ObjectRef<Cluster>>,
    ) -> Self {
        Self {
            hub,
            config,
            copy,
            instance,
            signing_keys: String::new(),
            notify,
            entries: Mutex::default(),
            states: Arc::default(),
        }
    }

    /// The state of Cluster `r`'s push connection, if it is a push cluster.
    pub(crate) fn state(&self, r: &ObjectRef<Cluster>) -> Option<PushState> {
        self.states.lock().expect("push states").get(r).cloned()
    }

    /// Stops Cluster `r`'s task (nothing is deleted anywhere) and forgets its state.
    pub(crate) fn stop(&self, r: &ObjectRef<Cluster>) {
        if self
            .entries
            .lock()
            .expect("push entries")
            .remove(r)
            .is_some()
        {
            tracing::info!(cluster = %r, "push task stopped");
        }
        self.states.lock().expect("push states").remove(r);
    }

    fn record(
        &self,
        r: &ObjectRef<Cluster>,
        source: Source,
        task: Option<AbortOnDrop>,
        state: PushState,
    ) {
        // Replacing the entry drops (aborts) the previous task.
        self.entries.lock().expect("push entries").insert(
            r.clone(),
            Entry {
                source,
                _task: task,
            },
        );
        self.states
            .lock()
            .expect("push states")
            .insert(r.clone(), state);
    }

    /// Makes Cluster `cluster`'s push task match its spec and Secret (`cached_version`: the
    /// Secret's resourceVersion in the cache) and returns its state (`None` in pull mode).
    pub(crate) async fn ensure(
        &self,
        cluster: &Cluster,
        cached_version: Option<&str>,
    ) -> Result<Option<PushState>, Error> {
        let r = ObjectRef::from_obj(cluster);
        let current = self
            .entries
            .lock()
            .expect("push entries")
            .get(&r)
            .map(|e| e.source.clone());
        let deleting = cluster.metadata.deletion_timestamp.is_some();
        match step(&cluster.spec, deleting, cached_version, current.as_ref()) {
            Step::Stop => {
                self.stop(&r);
                Ok(None)
            }
            Step::Missing(why) => {
                self.entries.lock().expect("push entries").remove(&r);
                let state = PushState::KubeconfigMissing(why);
                self.states
                    .lock()
                    .expect("push states")
                    .insert(r, state.clone());
                Ok(Some(state))
            }
            Step::Keep => Ok(self.state(&r)),
            Step::Load(source) => {
                let state = self.load(cluster, &r, source).await?;
                Ok(Some(state))
            }
        }
    }

    /// Reads the Secret, checks its kubeconfig and (re)starts the task.
    async fn load(
        &self,
        cluster: &Cluster,
        r: &ObjectRef<Cluster>,
        source: Source,
    ) -> Result<PushState, Error> {
        let workspace = cluster.namespace().unwrap_or_default();
        let secret = Api::<Secret>::namespaced(self.hub.clone(), &workspace)
            .get_opt(&source.secret)
            .await
            .map_err(|e| {
                Error::kube(
                    format!("read Secret {workspace}/{}", source.secret),
                    true,
                    e,
                )
            })?;
        let bytes = secret
            .and_then(|s| s.data)
            .and_then(|mut d| d.remove(&source.key))
            .map(|b| b.0);
        let Some(bytes) = bytes else {
            let state = PushState::KubeconfigMissing(format!(
                "Secret {:?} has no key {:?} (kubeconfigSecretRef)",
                source.secret, source.key
            ));
            tracing::warn!(cluster = %r, reason = state.reason(), "push cluster not started");
            self.record(r, source, None, state.clone());
            return Ok(state);
        };
        let refused = |problem: Problem| match problem {
            Problem::Invalid(m) => PushState::KubeconfigInvalid(format!(
                "Secret {:?} key {:?}: {m}",
                source.secret, source.key
            )),
            p @ Problem::ExecNotAllowed(_) => PushState::ExecNotAllowed(p.to_string()),
        };
        let checked = kubeconfig::check(&bytes, self.config.allow_kubeconfig_exec);
        drop(bytes);
        let config = match checked {
            Ok(k) => kubeconfig::client_config(k, self.config.timeouts).await,
            Err(p) => Err(p),
        };
        let client = config.and_then(|c| {
            let ua = format!("tender-hub-push/{}", env!("CARGO_PKG_VERSION"));
            tender_runtime::client::client_from_config(c, None, &ua).map_err(|_| {
                Problem::Invalid("no client can be built from the kubeconfig".to_string())
            })
        });
        let down = match client {
            Ok(c) => c,
            Err(problem) => {
                let state = refused(problem);
                tracing::warn!(cluster = %r, reason = state.reason(), message = %state.message(), "push cluster not started");
                self.record(r, source, None, state.clone());
                return Ok(state);
            }
        };
        let agent = PushAgent {
            workspace,
            cluster: cluster.name_any(),
            agent_namespace: cluster.spec.agent_namespace().to_string(),
            copy_resources_downstream: self.copy,
            identity: format!("{}/push", self.instance),
            heartbeat_interval: self.config.heartbeat_interval,
            hub_signing_keys: self.signing_keys.clone(),
        };
        let task = tokio::spawn(supervise(
            r.clone(),
            self.hub.clone(),
            down,
            agent,
            self.config.clone(),
            self.states.clone(),
            self.notify.clone(),
        ));
        tracing::info!(cluster = %r, secret = %source.secret, version = %source.resource_version, "push task started");
        self.record(r, source, Some(AbortOnDrop(task)), PushState::Connecting);
        Ok(PushState::Connecting)
    }
}

/// One push cluster: probe, run the agent while the cluster answers, report every change.
#[allow(clippy::too_many_arguments)]
async fn supervise(
    r: ObjectRef<Cluster>,
    hub: Client,
    down: Client,
    agent: PushAgent,
    config: PushConfig,
    states: Arc<Mutex<HashMap<ObjectRef<Cluster>, PushState>>>,
    notify: UnboundedSender<ObjectRef<Cluster>>,
) {
    let mut running: Option<AbortOnDrop> = None;
    loop {
        let mut state = probe(&down, &agent.agent_namespace, config.probe_timeout).await;
        if state.is_connected() {
            match &config.runner {
                None => {
                    state = PushState::Unreachable(
                        "this hub process runs no push agents (it was started without a push runner)"
                            .to_string(),
                    );
                }
                Some(runner) if running.as_ref().is_none_or(|t| t.0.is_finished()) => {
                    running = Some(AbortOnDrop(tokio::spawn(run_agent(
                        r.clone(),
                        runner.0.run(hub.clone(), down.clone(), agent.clone()),
                    ))));
                }
                Some(_) => {}
            }
        } else if running.take().is_some() {
            // Dropping the agent deletes nothing; it starts afresh once the cluster answers.
            tracing::info!(cluster = %r, reason = state.reason(), "push cluster not answering: agent stopped");
        }
        let changed = {
            let mut states = states.lock().expect("push states");
            let before = states.insert(r.clone(), state.clone());
            before.as_ref() != Some(&state)
        };
        if changed {
            tracing::info!(cluster = %r, reason = state.reason(), message = %state.message(), "push cluster state");
            let _ = notify.unbounded_send(r.clone());
        }
        tokio::time::sleep(config.probe_interval).await;
    }
}

async fn run_agent(r: ObjectRef<Cluster>, agent: BoxFuture<'static, anyhow::Result<()>>) {
    if let Err(error) = agent.await {
        tracing::warn!(cluster = %r, %error, "push agent stopped; restarted at the next successful probe");
    }
}

/// One probe: `/version` (does it answer?), then the agent namespace (does it accept the
/// identity?), both within `timeout`.
async fn probe(down: &Client, agent_namespace: &str, timeout: Duration) -> PushState {
    let check = async {
        down.apiserver_version().await?;
        Api::<Namespace>::all(down.clone())
            .get_metadata_opt(agent_namespace)
            .await?;
        Ok::<_, kube::Error>(())
    };
    match tokio::time::timeout(timeout, check).await {
        Err(_) => PushState::Unreachable(format!(
            "the cluster did not answer within {} s",
            timeout.as_secs_f32()
        )),
        Ok(Ok(())) => PushState::Connected,
        Ok(Err(kube::Error::Api(s))) if s.code == 401 || s.code == 403 => {
            PushState::Refused(format!(
                "the cluster refuses the kubeconfig's identity: {} ({})",
                s.reason, s.code
            ))
        }
        Ok(Err(e)) => PushState::Unreachable(format!(
            "the cluster does not answer: {}",
            tender_runtime::reconcile::error_text(&e, true)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tender_types::KubeconfigSecretRef;

    #[test]
    fn the_hub_library_does_not_depend_on_the_agent() {
        // Decision 0084-hub-library-without-the-agent: the agent reaches the hub only through
        // `PushRunner`.
        let manifest = include_str!("../../Cargo.toml");
        let deps = manifest
            .split("[dependencies]")
            .nth(1)
            .expect("a [dependencies] table");
        assert!(
            !deps
                .lines()
                .any(|l| l.trim_start().starts_with("tender-agent")),
            "crates/hub/Cargo.toml must not depend on tender-agent"
        );
    }

    fn push_spec(key: Option<&str>) -> ClusterSpec {
        ClusterSpec {
            kubeconfig_secret_ref: Some(KubeconfigSecretRef {
                name: "edge-kubeconfig".into(),
                key: key.map(Into::into),
            }),
            ..Default::default()
        }
    }

    fn source(version: &str, key: &str) -> Source {
        Source {
            secret: "edge-kubeconfig".into(),
            key: key.into(),
            resource_version: version.into(),
        }
    }

    #[test]
    fn pull_mode_and_deletion_stop_the_task() {
        let running = source("1", "value");
        assert_eq!(
            step(&ClusterSpec::default(), false, Some("1"), Some(&running)),
            Step::Stop
        );
        assert_eq!(
            step(&push_spec(None), true, Some("1"), Some(&running)),
            Step::Stop
        );
    }

    #[test]
    fn a_missing_secret_is_reported_by_name() {
        match step(&push_spec(None), false, None, None) {
            Step::Missing(why) => assert!(why.contains("edge-kubeconfig"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn only_a_new_secret_version_or_key_reloads() {
        let running = source("7", "value");
        assert_eq!(
            step(&push_spec(None), false, Some("7"), Some(&running)),
            Step::Keep,
            "nothing changed"
        );
        assert_eq!(
            step(&push_spec(None), false, Some("8"), Some(&running)),
            Step::Load(source("8", "value")),
            "rotated credential"
        );
        assert_eq!(
            step(&push_spec(Some("other")), false, Some("7"), Some(&running)),
            Step::Load(source("7", "other")),
            "another key"
        );
        assert_eq!(
            step(&push_spec(None), false, Some("7"), None),
            Step::Load(source("7", "value")),
            "first start"
        );
    }

    #[test]
    fn states_map_to_their_reasons() {
        let cases = [
            (PushState::Connecting, "Connecting"),
            (PushState::Connected, "ClusterConnected"),
            (
                PushState::KubeconfigMissing(String::new()),
                "KubeconfigMissing",
            ),
            (
                PushState::KubeconfigInvalid(String::new()),
                "KubeconfigInvalid",
            ),
            (
                PushState::ExecNotAllowed(String::new()),
                "KubeconfigExecNotAllowed",
            ),
            (PushState::Refused(String::new()), "KubeconfigRefused"),
            (PushState::Unreachable(String::new()), "ClusterUnreachable"),
        ];
        for (state, reason) in cases {
            assert_eq!(state.reason(), reason);
            assert_eq!(state.is_connected(), reason == "ClusterConnected");
        }
    }
}
