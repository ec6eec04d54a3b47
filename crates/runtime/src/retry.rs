//! The one finalizer and error-policy helper of every controller, hub and agent.
//!
//! - [`finalized`]: kube's finalizer flow (add the finalizer before the first apply; on
//!   deletion run the cleanup, then remove it), with a failure reported as
//!   [`ReconcileError::Finalizer`] naming the object.
//! - [`Backoffs`]: per-object exponential backoff keyed by the object's reference (kind,
//!   namespace, name), reset when the object reconciles successfully — one failing object
//!   never slows another, and a flapping one backs off instead of retrying at a fixed pace.
//! - [`error_policy`]: counts the failure by its stable `reason()`, logs it (never Secret
//!   data: [`ReconcileError`] messages do not quote it) and requeues after the object's next
//!   delay.

use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{Api, DynamicObject};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::Metrics;
use crate::reconcile::ReconcileError;

/// First retry delay of [`Backoffs::default`].
pub const DEFAULT_INITIAL_DELAY: Duration = Duration::from_secs(1);
/// Longest retry delay of [`Backoffs::default`] (kube's own default backoff stops there too).
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(30);

/// Per-object exponential backoff: the n-th consecutive failure of one object waits
/// `initial * 2^(n-1)`, at most `max`; a success forgets the object.
#[derive(Debug)]
pub struct Backoffs {
    initial: Duration,
    max: Duration,
    failures: Mutex<HashMap<ObjectRef<DynamicObject>, u32>>,
}

impl Default for Backoffs {
    fn default() -> Self {
        Self::new(DEFAULT_INITIAL_DELAY, DEFAULT_MAX_DELAY)
    }
}

impl Backoffs {
    /// Backoffs starting at `initial` and doubling up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max: max.max(initial),
            failures: Mutex::default(),
        }
    }

    /// The delay after `failures` consecutive failures (`failures >= 1`). Pure.
    pub fn delay_after(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.initial
            .checked_mul(1u32 << doublings)
            .unwrap_or(self.max)
            .min(self.max)
    }

    /// Records one more failure of `obj` and returns how long to wait before retrying it.
    pub fn failed<K>(&self, obj: &K) -> Duration
    where
        K: Resource<DynamicType = ()>,
    {
        let mut failures = self.failures.lock().expect("backoffs");
        let n = failures.entry(key(obj)).or_insert(0);
        *n = n.saturating_add(1);
        self.delay_after(*n)
    }

    /// Forgets `obj`'s failures (it reconciled successfully, or it is gone).
    pub fn succeeded<K>(&self, obj: &K)
    where
        K: Resource<DynamicType = ()>,
    {
        self.failures.lock().expect("backoffs").remove(&key(obj));
    }

    /// Consecutive failures recorded for `obj`.
    pub fn failures<K>(&self, obj: &K) -> u32
    where
        K: Resource<DynamicType = ()>,
    {
        self.failures
            .lock()
            .expect("backoffs")
            .get(&key(obj))
            .copied()
            .unwrap_or(0)
    }
}

fn key<K>(obj: &K) -> ObjectRef<DynamicObject>
where
    K: Resource<DynamicType = ()>,
{
    ObjectRef::<K>::new(&obj.name_any())
        .within(obj.meta().namespace.as_deref().unwrap_or_default())
        .erase()
}

/// `Kind namespace/name` of `obj`, as errors and logs name it.
pub fn object_name<K>(obj: &K) -> String
where
    K: Resource<DynamicType = ()>,
{
    let kind = K::kind(&());
    match obj.meta().namespace.as_deref() {
        Some(ns) => format!("{kind} {ns}/{}", obj.name_any()),
        None => format!("{kind} {}", obj.name_any()),
    }
}

/// Runs `reconcile` under finalizer `name` on `obj` (kube's finalizer helper): the finalizer
/// is added before the first [`Event::Apply`]; once `obj` is being deleted, [`Event::Cleanup`]
/// runs and the finalizer is removed when it succeeds. A success resets `obj`'s backoff.
pub async fn finalized<K, F, Fut>(
    api: &Api<K>,
    name: &str,
    obj: Arc<K>,
    backoffs: &Backoffs,
    reconcile: F,
) -> Result<Action, ReconcileError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug,
    F: FnOnce(Event<K>) -> Fut,
    Fut: Future<Output = Result<Action, ReconcileError>>,
{
    let object = object_name(obj.as_ref());
    let kept = Arc::clone(&obj);
    let action = finalizer(api, name, obj, reconcile)
        .await
        .map_err(|source| ReconcileError::Finalizer {
            object,
            source: Box::new(source),
        })?;
    backoffs.succeeded(kept.as_ref());
    Ok(action)
}

/// The error policy of controller `controller`: counts the failure by its reason, logs it and
/// requeues `obj` after its next backoff delay.
pub fn error_policy<K>(
    controller: &str,
    obj: &K,
    error: &ReconcileError,
    backoffs: &Backoffs,
    metrics: &Metrics,
) -> Action
where
    K: Resource<DynamicType = ()>,
{
    metrics.reconcile_error(controller, error.reason());
    let delay = backoffs.failed(obj);
    tracing::warn!(
        controller,
        object = %object_name(obj),
        reason = error.reason(),
        %error,
        retry_in = ?delay,
        "reconcile failed; retrying"
    );
    Action::requeue(delay)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use kube::api::ObjectMeta;

    fn cm(ns: &str, name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn delays_double_up_to_the_cap() {
        let b = Backoffs::new(Duration::from_secs(1), Duration::from_secs(30));
        let delays: Vec<u64> = (1..=8).map(|n| b.delay_after(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(
            b.delay_after(u32::MAX),
            Duration::from_secs(30),
            "no overflow"
        );
    }

    #[test]
    fn each_object_has_its_own_backoff_reset_by_success() {
        let b = Backoffs::default();
        let a = cm("ws", "a");
        assert_eq!(b.failed(&a), Duration::from_secs(1));
        assert_eq!(b.failed(&a), Duration::from_secs(2));
        assert_eq!(b.failed(&a), Duration::from_secs(4));
        // Another object (other name, other namespace, other kind) starts afresh.
        assert_eq!(b.failed(&cm("ws", "b")), Duration::from_secs(1));
        assert_eq!(b.failed(&cm("other", "a")), Duration::from_secs(1));
        let secret = Secret {
            metadata: a.metadata.clone(),
            ..Default::default()
        };
        assert_eq!(b.failed(&secret), Duration::from_secs(1));
        assert_eq!(b.failures(&a), 3);
        b.succeeded(&a);
        assert_eq!(b.failures(&a), 0);
        assert_eq!(b.failed(&a), Duration::from_secs(1), "reset by success");
        assert_eq!(b.failures(&cm("ws", "b")), 1, "others untouched");
    }

    #[test]
    fn error_policy_counts_and_requeues_after_the_objects_delay() {
        let metrics = Metrics::new();
        let b = Backoffs::default();
        let a = cm("ws", "a");
        let error = ReconcileError::Config("bad".into());
        let first = error_policy("test", &a, &error, &b, &metrics);
        let second = error_policy("test", &a, &error, &b, &metrics);
        assert_eq!(first, Action::requeue(Duration::from_secs(1)));
        assert_eq!(second, Action::requeue(Duration::from_secs(2)));
        let text = metrics.encode();
        let counted = text
            .lines()
            .find(|l| l.contains("reconcile_errors") && l.contains(r#"reason="InvalidConfig""#))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(counted.ends_with(" 2"), "{counted}");
        assert_eq!(object_name(&a), "ConfigMap ws/a");
    }
}
