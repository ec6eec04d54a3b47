//! The small HTTP server every tender process runs for Prometheus and the kubelet's probes.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use tokio::net::TcpListener;

use crate::{Error, Metrics, Result};

/// Content type of the OpenMetrics text exposition that `prometheus-client` produces.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Readiness flag shared between the controllers (which set it) and `/readyz` (which reads it).
///
/// Cloning is cheap and every clone sees the same flag.
#[derive(Clone, Debug, Default)]
pub struct Health {
    ready: Arc<AtomicBool>,
}

impl Health {
    /// A handle that starts not ready, so traffic waits for caches to sync.
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks the process ready (or not ready again, e.g. after losing the apiserver).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    /// Whether `/readyz` currently answers 200.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    health: Health,
}

/// The routes `/metrics`, `/healthz` and `/readyz`, for callers that bring their own listener.
pub fn router(metrics: Arc<Metrics>, health: Health) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz_handler))
        .with_state(AppState { metrics, health })
}

async fn metrics_handler(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
        state.metrics.encode(),
    )
}

async fn readyz_handler(State(state): State<AppState>) -> impl IntoResponse {
    if state.health.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

/// Binds `addr` and serves the probe and metrics routes until the returned future is dropped.
///
/// Binding happens inside the future, so a port clash surfaces as [`Error::Bind`] when awaited.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>, health: Health) -> Result<()> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })?;
    serve_on(listener, metrics, health).await
}

/// Serves on an already bound listener (tests bind port 0 and read the real port first).
pub async fn serve_on(listener: TcpListener, metrics: Arc<Metrics>, health: Health) -> Result<()> {
    if let Ok(local) = listener.local_addr() {
        tracing::info!(addr = %local, "serving /metrics, /healthz and /readyz");
    }
    axum::serve(listener, router(metrics, health))
        .await
        .map_err(Error::Serve)
}

#[cfg(test)]
mod tests {
    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::TcpStream,
    };

    use super::*;

    /// One HTTP/1.1 GET over a fresh connection; returns the status line's code and the raw response.
    async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
        let mut stream = TcpStream::connect(addr)
            .await
            .expect("connect to test server");
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream
            .write_all(request.as_bytes())
            .await
            .expect("send request");
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .await
            .expect("read response");
        let status = response
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {response:?}"));
        (status, response)
    }

    #[tokio::test]
    async fn serves_probes_and_metrics_over_real_http() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind port 0");
        let addr = listener.local_addr().expect("local addr");
        let metrics = Arc::new(Metrics::new());
        metrics.reconcile_error("bundle", "SourceMissing");
        let health = Health::new();
        let server = tokio::spawn(serve_on(listener, metrics, health.clone()));

        let (status, _) = http_get(addr, "/healthz").await;
        assert_eq!(status, 200, "healthz answers while the process runs");

        let (status, _) = http_get(addr, "/readyz").await;
        assert_eq!(status, 503, "readyz refuses before set_ready(true)");

        health.set_ready(true);
        let (status, _) = http_get(addr, "/readyz").await;
        assert_eq!(status, 200, "readyz answers after set_ready(true)");

        let (status, body) = http_get(addr, "/metrics").await;
        assert_eq!(status, 200);
        assert!(
            body.to_ascii_lowercase()
                .contains(&format!("content-type: {OPENMETRICS_CONTENT_TYPE}")),
            "{body}"
        );
        assert!(
            body.contains(
                "reconcile_errors_total{controller=\"bundle\",reason=\"SourceMissing\"} 1"
            )
        );
        assert!(body.contains("# EOF"));

        let (status, _) = http_get(addr, "/nope").await;
        assert_eq!(status, 404);

        server.abort();
    }

    #[test]
    fn health_clones_share_one_flag() {
        let health = Health::new();
        let other = health.clone();
        assert!(!other.is_ready());
        health.set_ready(true);
        assert!(other.is_ready());
        health.set_ready(false);
        assert!(!other.is_ready());
    }
}
