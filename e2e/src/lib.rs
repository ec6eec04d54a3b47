//! tender's real multi-cluster test environment and end-to-end test helpers.
//!
//! [`TestEnv`] starts one etcd plus a hub and N downstream clusters on loopback, each a
//! real kube-apiserver and kube-controller-manager built from the Kubernetes Go modules
//! (see `e2e/controlplane`). Nothing here is a fake: RBAC, admission, CRD validation,
//! garbage collection and namespace deletion are the real thing.

mod build;
mod env;
/// Certificates for the loopback clusters and for test servers (a private CA).
pub mod pki;
mod process;
mod wait;

pub use build::{
    KUBERNETES_VERSION, ensure_controlplane, ensure_helm, ensure_kustomize, ensure_oci_registry,
    ensure_promql_check,
};
pub use env::{
    ADMIN_USER, ClusterInfo, EnvOptions, EnvRecord, HUB, RESTRICTED_USERS, TestEnv,
    client_from_yaml, down, downstream_name, free_port, kubeconfig_yaml,
};
pub use process::Process;
pub use wait::{eventually, unique_name, within};

use tokio::sync::OnceCell;

/// An environment with `downstream` downstream clusters shared by every test of the test
/// binary that asks for that many (started by the first). Its processes die with the test
/// binary; tests keep out of each other's way by using their own namespaces and workspaces.
///
/// # Panics
/// When the environment does not start.
pub async fn shared_env(downstream: usize) -> &'static TestEnv {
    shared_env_of("", downstream).await
}

/// Like [`shared_env`], but shared only by the tests that name the same `group`: for tests
/// whose cluster-scoped objects would meet other tests' (a chart's CRDs or webhooks, the agent
/// chart's fixed-name ClusterRoleBinding, a user granted rights cluster-wide).
///
/// # Panics
/// When the environment does not start.
pub async fn shared_env_of(group: &'static str, downstream: usize) -> &'static TestEnv {
    type Cells = std::collections::HashMap<(&'static str, usize), &'static OnceCell<TestEnv>>;
    static ENVS: std::sync::Mutex<Option<Cells>> = std::sync::Mutex::new(None);
    require_bubblewrap();
    let cell = *ENVS
        .lock()
        .expect("shared environments")
        .get_or_insert_with(Cells::new)
        .entry((group, downstream))
        .or_insert_with(|| Box::leak(Box::new(OnceCell::new())));
    cell.get_or_init(|| async {
        TestEnv::start(EnvOptions {
            downstream,
            state_dir: None,
        })
        .await
        .expect("starting the test environment")
    })
    .await
}

/// Registering clusters and running agents in-process (owned by the agent work).
pub mod agent_harness;
pub mod apply;
/// The apiservers' audit logs: what each identity was answered.
pub mod audit;
pub mod binaries;
pub mod charts;
/// Installing the CRDs into a test cluster.
pub mod crds;
pub mod dockerfile;
pub mod fixture;
/// Running tender's hub in-process against the test environment (owned by the hub work).
pub mod hub_harness;
pub mod kubelet_player;
pub mod kyverno;
pub mod local_pod;
pub mod oci_registry;
/// Peers for `tender-bench --peers` (Flux, Kyverno): build recipes and CRDs.
pub mod peers;
pub mod prometheus_operator;
pub mod proxy;
pub mod real_charts;
pub mod running;

/// What a machine without bubblewrap is told, once, instead of a panic per test that runs a
/// binary under its pod's securityContext ([`local_pod`]).
pub const BUBBLEWRAP_MISSING: &str = "tender-e2e: bubblewrap (`bwrap`) is not installed; the end-to-end tests run tender's binaries under their pod's securityContext with it (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap)";

/// Whether `bwrap` is on `PATH`.
pub fn bubblewrap_installed() -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("bwrap").is_file()))
}

/// Ends this test process with [`BUBBLEWRAP_MISSING`] when `bwrap` is missing: one line, and
/// `cargo test` stops at the first test binary that needs it.
pub(crate) fn require_bubblewrap() {
    static CHECKED: std::sync::Once = std::sync::Once::new();
    CHECKED.call_once(|| {
        if !bubblewrap_installed() {
            eprintln!("{BUBBLEWRAP_MISSING}");
            std::process::exit(2);
        }
    });
}
