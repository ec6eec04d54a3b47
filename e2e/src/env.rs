//! The multi-cluster environment: one etcd, a hub and N downstream clusters on loopback,
//! each with its own kube-apiserver and kube-controller-manager.

use std::collections::BTreeSet;
use std::fs;
use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde::{Deserialize, Serialize};

use crate::build::ensure_controlplane;
use crate::pki::{Ca, write_service_account_keys};
use crate::process::Process;

/// The admin identity (group `system:masters`) every kubeconfig written by the environment uses.
pub const ADMIN_USER: &str = "tender-admin";

/// Restricted identities present in every cluster. They are authenticated and nothing
/// else: RBAC grants them exactly what a test binds, so tests can prove a 403.
pub const RESTRICTED_USERS: [&str; 3] = ["alice", "bob", "carol"];

/// Name of the hub cluster.
pub const HUB: &str = "hub";

/// Name of the `i`-th downstream cluster (1-based).
pub fn downstream_name(i: usize) -> String {
    format!("downstream-{i}")
}

/// What to start.
#[derive(Debug, Clone, Default)]
pub struct EnvOptions {
    /// Number of downstream clusters besides the hub.
    pub downstream: usize,
    /// Where kubeconfigs, certificates, logs and etcd data go. A fresh temporary directory
    /// (removed on drop) when `None`.
    pub state_dir: Option<PathBuf>,
}

/// One cluster of the environment.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterInfo {
    /// `hub` or `downstream-<i>`.
    pub name: String,
    /// `https://127.0.0.1:<port>`.
    pub server: String,
    /// Admin kubeconfig, `<state-dir>/<name>.kubeconfig`.
    pub kubeconfig: PathBuf,
}

/// What `up` records in `<state-dir>/env.json`, for `down` and for tools.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EnvRecord {
    /// Process id of the supervising `tender-testenv up` or test process.
    pub supervisor_pid: u32,
    /// Every component's process id.
    pub pids: Vec<u32>,
    /// The clusters.
    pub clusters: Vec<ClusterInfo>,
    /// Bearer tokens by user name.
    pub tokens: Vec<(String, String)>,
}

/// A running environment. Dropping it stops every process; a temporary state directory is
/// removed too.
pub struct TestEnv {
    state_dir: PathBuf,
    remove_state_dir: bool,
    ca_pem: String,
    clusters: Vec<ClusterInfo>,
    tokens: Vec<(String, String)>,
    processes: Mutex<Vec<Process>>,
    /// Components stopped on purpose ([`TestEnv::stop_component`]), which
    /// [`TestEnv::check_alive`] does not report.
    stopped: Mutex<BTreeSet<String>>,
}

impl std::fmt::Debug for TestEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestEnv")
            .field("state_dir", &self.state_dir)
            .field("clusters", &self.clusters)
            .finish_non_exhaustive()
    }
}

/// A free port on loopback, for a child that takes it from its config. Picked below Linux's
/// ephemeral range (32768 and up): the ports `bind(0)` hands out are also the local ports of
/// outgoing connections, and one of those can take a port between our check and the child's
/// bind (a port found that way failed the demo in CI once). Sequential within a process, so
/// never the same port twice; the starting point differs between processes.
pub fn free_port() -> Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let seed = std::process::id().wrapping_mul(7_919) % SPAN;
    let _ = NEXT.compare_exchange(u32::MAX, seed, Ordering::Relaxed, Ordering::Relaxed);
    for _ in 0..SPAN {
        let port = (LOW + NEXT.fetch_add(1, Ordering::Relaxed) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free port on 127.0.0.1 between {LOW} and {}", LOW + SPAN)
}

fn random_token() -> Result<String> {
    let mut buf = [0u8; 16];
    fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(hex::encode(buf))
}

/// Removes state directories of earlier runs whose supervisor is gone (a test binary that
/// was killed cannot clean up after itself).
#[allow(unsafe_code)] // libc calls, each with a SAFETY comment
fn sweep_stale(root: &Path) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(pid) = name.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        // SAFETY: signal 0 only probes for existence.
        if unsafe { libc::kill(pid, 0) } != 0 {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

fn temp_state_dir() -> Result<PathBuf> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let root = std::env::temp_dir().join("tender-e2e");
    fs::create_dir_all(&root)?;
    sweep_stale(&root);
    let dir = root.join(format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn log_tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(25)..].join("\n")
}

/// Renders a kubeconfig for `server` authenticating with a bearer token.
pub fn kubeconfig_yaml(
    cluster: &str,
    server: &str,
    ca_pem: &str,
    user: &str,
    token: &str,
) -> String {
    tender_runtime::kubeconfig::TokenKubeconfig {
        name: cluster,
        server,
        ca_pem: ca_pem.as_bytes(),
        user,
        token,
        namespace: None,
    }
    .to_yaml()
}

impl TestEnv {
    /// Builds the control plane if needed, starts everything and waits until every
    /// apiserver answers `/readyz`; then writes `<state-dir>/ready`.
    ///
    /// Ports are picked free by the kernel and handed to the components, so another process
    /// (a parallel test environment) can take one first; such a start is retried on fresh
    /// ports, up to three times.
    pub async fn start(opts: EnvOptions) -> Result<TestEnv> {
        let mut attempt = 1;
        loop {
            match Self::start_once(opts.clone()).await {
                Err(e) if attempt < 3 && format!("{e:#}").contains("address already in use") => {
                    eprintln!(
                        "tender-e2e: a port was taken before its component bound it; starting again"
                    );
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    async fn start_once(opts: EnvOptions) -> Result<TestEnv> {
        let bin = tokio::task::spawn_blocking(ensure_controlplane).await??;
        let (state_dir, remove_state_dir) = match opts.state_dir {
            Some(d) => {
                if d.join("env.json").exists() {
                    bail!(
                        "{} already holds an environment; run `tender-testenv down --state-dir {}` first",
                        d.display(),
                        d.display()
                    );
                }
                fs::create_dir_all(&d)?;
                (fs::canonicalize(&d)?, false)
            }
            None => (temp_state_dir()?, true),
        };
        let _ = fs::remove_file(state_dir.join("ready"));
        let ca = Ca::new()?;
        let ca_pem = ca.cert_pem();
        fs::write(state_dir.join("ca.crt"), &ca_pem)?;

        let mut tokens = vec![(ADMIN_USER.to_string(), random_token()?)];
        for u in RESTRICTED_USERS {
            tokens.push((u.to_string(), random_token()?));
        }
        let token_file = state_dir.join("tokens.csv");
        let mut csv = String::new();
        for (i, (user, token)) in tokens.iter().enumerate() {
            let groups = if user == ADMIN_USER {
                "system:masters"
            } else {
                ""
            };
            csv.push_str(&format!("{token},{user},uid-{i},\"{groups}\"\n"));
        }
        fs::write(&token_file, csv)?;

        let mut env = TestEnv {
            state_dir: state_dir.clone(),
            remove_state_dir,
            ca_pem,
            clusters: Vec::new(),
            tokens,
            processes: Mutex::new(Vec::new()),
            stopped: Mutex::new(BTreeSet::new()),
        };

        let etcd_url = format!("http://127.0.0.1:{}", free_port()?);
        let etcd_dir = state_dir.join("etcd");
        let etcd_log = state_dir.join("etcd.log");
        env.push(Process::start(
            "etcd",
            &bin,
            &[
                "etcd".into(),
                format!("--data-dir={}", etcd_dir.display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--listen-peer-urls=http://127.0.0.1:{}", free_port()?),
            ],
            &etcd_log,
        )?);

        let audit_policy = state_dir.join("audit-policy.yaml");
        fs::write(&audit_policy, AUDIT_POLICY)?;

        let mut names = vec![HUB.to_string()];
        names.extend((1..=opts.downstream).map(downstream_name));
        for name in &names {
            let port = free_port()?;
            let dir = state_dir.join(name);
            fs::create_dir_all(&dir)?;
            ca.write_serving_cert(name, &dir.join("serving.crt"), &dir.join("serving.key"))?;
            write_service_account_keys(&dir.join("sa.key"), &dir.join("sa.pub"))?;
            let server = format!("https://127.0.0.1:{port}");
            let kubeconfig = state_dir.join(format!("{name}.kubeconfig"));
            fs::write(
                &kubeconfig,
                kubeconfig_yaml(
                    name,
                    &server,
                    &env.ca_pem,
                    ADMIN_USER,
                    env.token(ADMIN_USER),
                ),
            )?;
            let p = |f: &str| dir.join(f).display().to_string();
            env.push(Process::start(
                &format!("{name}/kube-apiserver"),
                &bin,
                &[
                    "kube-apiserver".into(),
                    format!("--etcd-servers={etcd_url}"),
                    format!("--etcd-prefix=/{name}"),
                    "--bind-address=127.0.0.1".into(),
                    "--advertise-address=127.0.0.1".into(),
                    format!("--secure-port={port}"),
                    format!("--cert-dir={}", p("certs")),
                    format!("--tls-cert-file={}", p("serving.crt")),
                    format!("--tls-private-key-file={}", p("serving.key")),
                    format!("--client-ca-file={}", state_dir.join("ca.crt").display()),
                    format!("--token-auth-file={}", token_file.display()),
                    "--authorization-mode=RBAC".into(),
                    format!("--service-account-key-file={}", p("sa.pub")),
                    format!("--service-account-signing-key-file={}", p("sa.key")),
                    "--service-account-issuer=https://kubernetes.default.svc".into(),
                    "--api-audiences=https://kubernetes.default.svc".into(),
                    "--service-cluster-ip-range=10.96.0.0/24".into(),
                    "--endpoint-reconciler-type=none".into(),
                    "--enable-priority-and-fairness=false".into(),
                    // `TENDER_E2E_PROFILING=1` serves Go's /debug/pprof to system:masters, so a
                    // benchmark can see where the apiserver's CPU goes.
                    format!(
                        "--profiling={}",
                        std::env::var_os("TENDER_E2E_PROFILING").is_some_and(|v| v == "1")
                    ),
                    "--enable-garbage-collector=true".into(),
                    // Every request of an identity under test, as JSON lines (read by the audit module).
                    format!("--audit-policy-file={}", audit_policy.display()),
                    format!("--audit-log-path={}", p("audit.log")),
                    "--audit-log-format=json".into(),
                    "--audit-log-mode=blocking".into(),
                    "--v=0".into(),
                ],
                &dir.join("kube-apiserver.log"),
            )?);
            env.clusters.push(ClusterInfo {
                name: name.clone(),
                server,
                kubeconfig,
            });
        }

        env.wait_ready(Duration::from_secs(180)).await?;

        for c in env.clusters.clone() {
            let dir = state_dir.join(&c.name);
            env.push(Process::start(
                &format!("{}/kube-controller-manager", c.name),
                &bin,
                &[
                    "kube-controller-manager".into(),
                    format!("--kubeconfig={}", c.kubeconfig.display()),
                    "--secure-port=0".into(),
                    "--leader-elect=false".into(),
                    "--use-service-account-credentials=false".into(),
                    "--controllers=garbage-collector-controller,namespace-controller,\
                     serviceaccount-controller,serviceaccount-token-controller,\
                     root-ca-certificate-publisher-controller,clusterrole-aggregation-controller"
                        .into(),
                    format!(
                        "--service-account-private-key-file={}",
                        dir.join("sa.key").display()
                    ),
                    format!("--root-ca-file={}", state_dir.join("ca.crt").display()),
                    "--concurrent-gc-syncs=10".into(),
                    "--v=0".into(),
                ],
                &dir.join("kube-controller-manager.log"),
            )?);
        }

        env.write_record()?;
        fs::write(state_dir.join("ready"), "ready\n")?;
        Ok(env)
    }

    fn push(&self, p: Process) {
        self.processes.lock().unwrap().push(p);
    }

    /// The bearer token of `user` (admin or one of [`RESTRICTED_USERS`]).
    pub fn token(&self, user: &str) -> &str {
        self.tokens
            .iter()
            .find(|(u, _)| u == user)
            .map(|(_, t)| t.as_str())
            .unwrap_or_else(|| panic!("no identity {user} in the test environment"))
    }

    /// Fails with the component's log if any process has exited.
    pub fn check_alive(&self) -> Result<()> {
        let stopped = self.stopped.lock().unwrap().clone();
        for p in self.processes.lock().unwrap().iter_mut() {
            if stopped.contains(p.name()) {
                continue;
            }
            if let Some(status) = p.exited() {
                let name = p.name().to_string();
                let log = self.log_path(&name);
                bail!(
                    "{name} exited ({status}); last lines of {}:\n{}",
                    log.display(),
                    log_tail(&log)
                );
            }
        }
        Ok(())
    }

    fn log_path(&self, component: &str) -> PathBuf {
        match component.split_once('/') {
            Some((cluster, c)) => self.state_dir.join(cluster).join(format!("{c}.log")),
            None => self.state_dir.join(format!("{component}.log")),
        }
    }

    async fn wait_ready(&self, timeout: Duration) -> Result<()> {
        for c in &self.clusters {
            self.wait_cluster_ready(&c.name, timeout).await?;
        }
        Ok(())
    }

    async fn wait_cluster_ready(&self, cluster: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        {
            let c = self.cluster(cluster);
            let client = self.client(&c.name).await?;
            loop {
                self.check_alive()?;
                let req = http::Request::get("/readyz").body(Vec::new())?;
                match client.request_text(req).await {
                    Ok(body) if body.trim() == "ok" => break,
                    Ok(_) | Err(_) if Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(250)).await
                    }
                    Ok(body) => bail!("{} /readyz: {body}", c.name),
                    Err(e) => bail!("{} did not become ready in {timeout:?}: {e}", c.name),
                }
            }
        }
        Ok(())
    }

    /// Stops `component` — `etcd`, `<cluster>/kube-apiserver` or
    /// `<cluster>/kube-controller-manager` — like an outage: SIGTERM, then SIGKILL after 5 s.
    /// It stays down until [`start_component`](Self::start_component).
    ///
    /// # Panics
    /// When the environment has no such component.
    pub fn stop_component(&self, component: &str) {
        let mut procs = self.processes.lock().unwrap();
        let p = procs
            .iter_mut()
            .find(|p| p.name() == component)
            .unwrap_or_else(|| panic!("no component {component} in the test environment"));
        self.stopped.lock().unwrap().insert(component.to_string());
        p.stop(Duration::from_secs(5));
    }

    /// Starts a component stopped by [`stop_component`](Self::stop_component) again, with the
    /// same command line: same ports, certificates and data (etcd keeps its data directory),
    /// forked like the first start so it still dies with this process. Waits until the
    /// apiservers it serves answer `/readyz`: its own for an apiserver, all of them for etcd.
    pub async fn start_component(&self, component: &str) -> Result<()> {
        {
            let mut procs = self.processes.lock().unwrap();
            let p = procs
                .iter_mut()
                .find(|p| p.name() == component)
                .with_context(|| format!("no component {component} in the test environment"))?;
            p.restart()?;
            self.stopped.lock().unwrap().remove(component);
        }
        self.write_record()?;
        let timeout = Duration::from_secs(120);
        match component.split_once('/') {
            Some((cluster, "kube-apiserver")) => self.wait_cluster_ready(cluster, timeout).await,
            Some(_) => Ok(()),
            None => self.wait_ready(timeout).await,
        }
    }

    fn write_record(&self) -> Result<()> {
        let record = EnvRecord {
            supervisor_pid: std::process::id(),
            pids: self
                .processes
                .lock()
                .unwrap()
                .iter()
                .map(Process::pid)
                .collect(),
            clusters: self.clusters.clone(),
            tokens: self.tokens.clone(),
        };
        fs::write(
            self.state_dir.join("env.json"),
            serde_json::to_vec_pretty(&record)?,
        )?;
        Ok(())
    }

    /// The state directory.
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// All clusters, hub first.
    pub fn clusters(&self) -> &[ClusterInfo] {
        &self.clusters
    }

    /// The named cluster.
    pub fn cluster(&self, name: &str) -> &ClusterInfo {
        self.clusters
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no cluster {name} in the test environment"))
    }

    /// The audit log of `cluster`'s apiserver (JSON lines; read with `tender_e2e::audit`).
    pub fn audit_log(&self, cluster: &str) -> PathBuf {
        self.state_dir
            .join(&self.cluster(cluster).name)
            .join("audit.log")
    }

    /// The CA certificate (PEM) every apiserver's serving certificate chains to.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A kubeconfig for `cluster` as `user` (admin or one of [`RESTRICTED_USERS`]).
    pub fn kubeconfig_as(&self, cluster: &str, user: &str) -> String {
        let c = self.cluster(cluster);
        kubeconfig_yaml(&c.name, &c.server, &self.ca_pem, user, self.token(user))
    }

    /// An admin client for `cluster`.
    pub async fn client(&self, cluster: &str) -> Result<kube::Client> {
        self.client_as(cluster, ADMIN_USER).await
    }

    /// A client for `cluster` authenticating as `user`.
    pub async fn client_as(&self, cluster: &str, user: &str) -> Result<kube::Client> {
        client_from_yaml(&self.kubeconfig_as(cluster, user)).await
    }

    /// Stops every process (etcd last) and removes a temporary state directory.
    pub fn stop(&self) {
        let mut procs = self.processes.lock().unwrap();
        while let Some(mut p) = procs.pop() {
            p.stop(Duration::from_secs(5));
        }
        let _ = fs::remove_file(self.state_dir.join("env.json"));
        let _ = fs::remove_file(self.state_dir.join("ready"));
        if self.remove_state_dir {
            let _ = fs::remove_dir_all(&self.state_dir);
        }
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A client from kubeconfig YAML text.
pub async fn client_from_yaml(yaml: &str) -> Result<kube::Client> {
    let kc = Kubeconfig::from_yaml(yaml).context("parsing kubeconfig")?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// Stops an environment started by another process, from its `env.json`.
pub fn down(state_dir: &Path) -> Result<()> {
    let path = state_dir.join("env.json");
    let record: EnvRecord = serde_json::from_slice(
        &fs::read(&path).with_context(|| format!("no environment at {}", path.display()))?,
    )?;
    // The supervisor stops its children itself; the pids are the fallback if it is stuck.
    crate::process::terminate(record.supervisor_pid, Duration::from_secs(20));
    for pid in record.pids.iter().rev() {
        crate::process::terminate(*pid, Duration::from_secs(5));
    }
    let _ = fs::remove_file(&path);
    let _ = fs::remove_file(state_dir.join("ready"));
    Ok(())
}

/// The audit policy of every test apiserver.
pub const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
  - level: None
    users: ["tender-admin", "system:apiserver"]
  - level: None
    nonResourceURLs: ["/healthz*", "/readyz*", "/livez*", "/version"]
  - level: Metadata
"#;
