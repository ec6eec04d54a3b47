use std::{net::SocketAddr, path::PathBuf};

/// Everything that can go wrong while setting up a tender process.
///
/// Each variant names what was being set up so the message alone tells an operator where to look.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The log filter (flag or `RUST_LOG`) is not a valid `EnvFilter` directive.
    #[error("invalid log filter {filter:?}: {source}")]
    LogFilter {
        /// The rejected directive string.
        filter: String,
        /// Why it was rejected.
        source: tracing_subscriber::filter::ParseError,
    },
    /// A global tracing subscriber was already installed (init called twice).
    #[error("cannot install the log subscriber: {0}")]
    TelemetryInit(#[source] tracing_subscriber::util::TryInitError),
    /// The explicitly given kubeconfig could not be read or used.
    #[error("cannot load kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The kubeconfig file given on the command line.
        path: PathBuf,
        /// What was wrong with it.
        source: kube::config::KubeconfigError,
    },
    /// Neither an in-cluster service account nor a default kubeconfig was usable.
    #[error(
        "cannot find Kubernetes credentials (no in-cluster service account, no usable \
         $KUBECONFIG or ~/.kube/config); pass --kubeconfig: {0}"
    )]
    InferConfig(#[from] kube::config::InferConfigError),
    /// The user agent contains characters not allowed in an HTTP header.
    #[error("user agent {0:?} is not a valid HTTP header value")]
    UserAgent(String),
    /// The Kubernetes client could not be built from an otherwise valid configuration.
    #[error("cannot build Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// The metrics/health server could not bind its address.
    #[error("cannot listen on {addr} for metrics and health probes: {source}")]
    Bind {
        /// The address that was asked for.
        addr: SocketAddr,
        /// Usually "address in use" or a permission error.
        source: std::io::Error,
    },
    /// The metrics/health server stopped with an I/O error.
    #[error("metrics and health server failed: {0}")]
    Serve(#[source] std::io::Error),
}
