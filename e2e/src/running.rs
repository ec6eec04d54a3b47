//! tender's binaries as processes the way the Helm charts install them: the hub chart and the
//! agent chart rendered by the pinned Helm and applied, each Deployment's container started as
//! a process ([`crate::local_pod`]) with the identity its chart grants — the hub as the chart's
//! ServiceAccount, an agent as the agent chart's downstream ServiceAccount with a hub
//! kubeconfig of the identity the hub provisioned for it (expiring tokens from the TokenRequest
//! API, never admin). Each [`Running`] process logs to a file, exposes its metrics, can be
//! killed and restarted, and prints the tail of its log when a test fails.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::ResourceExt;
use kube::api::Api;

use crate::apply::apply_yaml;
use crate::binaries::tender_binaries;
use crate::fixture::{Workspace, create_namespace};
use crate::hub_harness::agent_token;
use crate::local_pod::local_pod;
use crate::proxy::{TcpProxy, http_get};
use crate::{EnvOptions, HUB, Process, TestEnv, eventually, kubeconfig_yaml, unique_name};

/// How long a started or restarted process may take to answer `/readyz`.
const WAIT_READY: Duration = Duration::from_secs(120);

/// An environment of one test (leaked for the fixtures' `'static`), stopped when dropped.
pub struct OwnEnv(pub &'static TestEnv);

impl OwnEnv {
    /// Starts an environment with `downstream` downstream clusters.
    ///
    /// # Panics
    /// When the environment does not start.
    pub async fn start(downstream: usize) -> Self {
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
    crate::free_port().expect("a free port")
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `helm template` of chart `chart` (`tender-hub` or `tender-agent`) with `args` (`--set …`), rendered by the pinned Helm.
pub fn helm_template(chart: &str, namespace: &str, args: &[String]) -> String {
    let helm = crate::ensure_helm().expect("building helm");
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
pub struct Running {
    process: Process,
    metrics: SocketAddr,
}

impl Running {
    /// Starts container 0 of `deployment` (stored on `client`'s cluster at `server`) as pod
    /// `pod_name`, with its Secret volumes as files and its ServiceAccount's token; only the
    /// metrics address and the kubeconfig path are set, plus `flags`.
    pub async fn start(
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
        // `tender-hub` and its shards' `tender-hub-shard-<id>`; the agent's is `tender-agent`.
        let program = if deployment.name_any().starts_with("tender-hub") {
            &bins.hub
        } else {
            &bins.agent
        };
        // Under bubblewrap with the pod's securityContext and volumes (crate::local_pod).
        let (program, args) = pod.command(program);
        let process = Process::start_with_env(
            pod_name,
            &program,
            &args,
            &pod.env,
            &dir.join(format!("{pod_name}.log")),
        )
        .unwrap();
        let running = Self { process, metrics };
        running.wait_ready().await;
        running
    }

    pub fn name(&self) -> &str {
        self.process.name()
    }

    pub async fn wait_ready(&self) {
        eventually(
            &format!("{} to be ready", self.name()),
            WAIT_READY,
            || async {
                let ready = http_get(self.metrics, "/readyz")
                    .await
                    .is_ok_and(|(code, _)| code == 200);
                Ok::<_, std::convert::Infallible>(ready.then_some(()))
            },
        )
        .await;
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.process.log()).unwrap_or_default()
    }

    pub fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Its `/metrics` text (empty while it does not answer).
    pub async fn scrape(&self) -> String {
        http_get(self.metrics, "/metrics")
            .await
            .map(|(_, body)| body)
            .unwrap_or_default()
    }

    /// Every write its executor made (`tender_object_writes_total`, all verbs and kinds).
    pub async fn writes(&self) -> u64 {
        sum_of(&self.scrape().await, "tender_object_writes_total{", |_| {
            true
        })
    }

    /// SIGKILL, like a crash or an OOM kill: no Lease release, no graceful anything.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Starts the same command again (a container restart in the same pod).
    pub async fn restart(&mut self) {
        self.process.restart().unwrap();
        self.wait_ready().await;
    }

    /// Starts the same command again without waiting for `/readyz` (an agent whose hub
    /// refuses it never becomes ready).
    pub fn respawn(&mut self) {
        self.process.restart().unwrap();
    }

    pub fn assert_running(&mut self) {
        assert!(
            self.process.exited().is_none(),
            "{} exited; its log ends:\n{}",
            self.name(),
            self.log_tail()
        );
    }

    /// Lines of its log that show an RBAC refusal.
    pub fn refusals(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| shows_refusal(l))
            .map(str::to_string)
            .collect()
    }
}

/// Whether a log line shows an RBAC refusal: the words, or 403 as a number of its own (a
/// debug line's `tv_sec: 40368` is not one).
fn shows_refusal(line: &str) -> bool {
    let l = line.to_ascii_lowercase();
    l.contains("forbidden")
        || l.contains("unauthorized")
        || l.split(|c: char| !c.is_ascii_alphanumeric())
            .any(|word| word == "403")
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
pub fn sum_of(text: &str, prefix: &str, keep: impl Fn(&str) -> bool) -> u64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .filter_map(|rest| rest.split_once("} "))
        .filter(|(labels, _)| keep(labels))
        .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
        .sum()
}

/// The hub chart rendered for workspace `ws` (plus `sets`) and applied in a fresh release
/// namespace; its Deployment.
pub async fn install_hub_chart(hub: &kube::Client, ws: &str, sets: &[&str]) -> Deployment {
    let release_ns = unique_name("tender-system");
    create_namespace(hub, &release_ns).await;
    apply_hub_chart(hub, &release_ns, ws, sets).await
}

/// The hub chart rendered for workspace `ws` (plus `sets`) and applied in `release_ns`; its
/// Deployment. (Its ClusterRoleBinding has a fixed name: one release namespace per cluster.)
pub async fn apply_hub_chart(
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
#[derive(Debug, Default)]
pub struct AgentOpts<'a> {
    /// The agent chart's release namespace downstream (default `tender-system`).
    pub release_ns: Option<&'a str>,
    /// `--set` values of the agent chart.
    pub sets: &'a [&'a str],
    /// Flags the chart does not expose.
    pub flags: &'a [(&'a str, &'a str)],
    /// A proxy the agent reaches the hub's apiserver through.
    pub via: Option<&'a TcpProxy>,
    /// Lifetime of the registration token in its hub kubeconfig (default 1 h).
    pub token_lifetime: Option<Duration>,
}

/// Starts the agent of Cluster `cluster` (registered in `ws`) on cluster `downstream` the way
/// the agent chart installs it: the chart rendered with a hub kubeconfig of the agent's own
/// identity (an expiring token of the ServiceAccount the hub provisioned, as `tender cluster
/// add` writes it), applied downstream, its Deployment run as a process with the chart's
/// downstream ServiceAccount.
pub async fn start_agent(
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
    let keys = crate::hub_harness::test_hub_signing_keys(&ws.hub, &ws.ns).await;
    let mut args = vec![
        "--set".to_string(),
        format!("hubSigningKeys={}", keys.replace(',', "\\,")),
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

#[cfg(test)]
mod tests {
    use super::shows_refusal;

    #[test]
    fn a_refusal_is_a_word_or_the_status_code_alone() {
        assert!(shows_refusal("ApiError: pods is forbidden: User ..."));
        assert!(shows_refusal("status: 403, reason: Forbidden"));
        assert!(shows_refusal("HTTP 403 on PATCH"));
        assert!(shows_refusal("error: Unauthorized"));
        // The line that failed CI once: a backoff deadline whose seconds begin with 403.
        assert!(!shows_refusal(
            "DEBUG kube_runtime::utils::stream_backoff: Error received, backing off \
             deadline=Instant { tv_sec: 40368, tv_nsec: 416300395 } duration=1.559386837s"
        ));
        assert!(!shows_refusal("took 4031 ms"));
    }
}
