//! Bounded waiting: tests poll with a deadline and fail with a clear message, never sleep.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `check` every 200 ms until it returns `Ok(Some(v))`, or panics after `timeout`
/// with `what` and the last error or `None` seen.
pub async fn eventually<T, E, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, E>>,
    E: std::fmt::Display,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = match check().await {
            Ok(Some(v)) => return v,
            Ok(None) => "condition not met yet".to_string(),
            Err(e) => format!("error: {e}"),
        };
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}; last: {last}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Polls `check` every 200 ms until it is true (then true) or `timeout` has passed (then
/// false): a window that ends early once what it waits for has happened, for a test that
/// asserts on what it counted in the window rather than on the wait.
pub async fn within<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A name unique within this process run, for per-test namespaces and objects.
pub fn unique_name(prefix: &str) -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id() % 100_000,
        N.fetch_add(1, Ordering::SeqCst)
    )
}
