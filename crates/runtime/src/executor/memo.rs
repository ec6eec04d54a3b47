//! The skip-unchanged memo: what the executor last wrote to an object, keyed by a typed
//! reference, until the watch that feeds the plan's cache catches up.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::ops::{Fingerprint, ObjectKey};

/// How long an echoed entry still answers for decisions made on the version it superseded:
/// far longer than a reconcile holds a cache read, short enough to bound the memo's size.
const ECHOED_FOR: Duration = Duration::from_secs(30);

/// Echoed entries are swept on every this many records.
const SWEEP_EVERY: u32 = 1024;

/// Remembers, per object, the cached resourceVersion a write was decided on, the content
/// written and the uid it produced. Until the cache moves past that version, a reconcile
/// reading the cache sees the old object and would write the same content again; the memo
/// tells the executor not to. The watch feed calls [`WriteMemo::forget`] for every event: from
/// then on the cache decides, and the entry only answers for a decision made on the exact
/// version the write replaced (a reconcile that read the cache just before the echo arrived),
/// which is stale by construction and followed by the reconcile the echo triggers.
#[derive(Debug, Default)]
pub struct WriteMemo(Mutex<Inner>);

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<ObjectKey, Entry>,
    records: u32,
}

#[derive(Debug, Clone)]
struct Entry {
    fingerprint: Fingerprint,
    uid: Option<String>,
    /// The resourceVersion the write produced: its watch event carries the same.
    version: Option<String>,
    /// When the write's watch event (or any later one) reached the cache.
    echoed: Option<Instant>,
}

impl Entry {
    fn answers(&self, fingerprint: &Fingerprint, now: Instant) -> bool {
        if self.fingerprint != *fingerprint {
            return false;
        }
        match self.echoed {
            None => true,
            // Without a version the decision may be about an object deleted since ("not
            // cached"), which must be written again.
            Some(at) => fingerprint.live_version.is_some() && now.duration_since(at) < ECHOED_FOR,
        }
    }
}

impl WriteMemo {
    /// The uid written, if the same content was written over the same cached version.
    /// `Some(None)` means "written, uid unknown".
    pub fn written(&self, key: &ObjectKey, fingerprint: &Fingerprint) -> Option<Option<String>> {
        let inner = self.0.lock().expect("write memo");
        let entry = inner.entries.get(key)?;
        entry
            .answers(fingerprint, Instant::now())
            .then(|| entry.uid.clone())
    }

    /// Records a write, its resulting uid and resourceVersion.
    pub fn record(
        &self,
        key: ObjectKey,
        fingerprint: Fingerprint,
        uid: Option<String>,
        version: Option<String>,
    ) {
        let mut inner = self.0.lock().expect("write memo");
        inner.records = inner.records.wrapping_add(1);
        if inner.records.is_multiple_of(SWEEP_EVERY) {
            let now = Instant::now();
            inner.entries.retain(|_, e| {
                e.echoed
                    .is_none_or(|at| now.duration_since(at) < ECHOED_FOR)
            });
        }
        inner.entries.insert(
            key,
            Entry {
                fingerprint,
                uid,
                version,
                echoed: None,
            },
        );
    }

    /// `key`'s watch event reached the cache, which decides again from now on.
    pub fn forget(&self, key: &ObjectKey) {
        let mut inner = self.0.lock().expect("write memo");
        if let Some(entry) = inner.entries.get_mut(key)
            && entry.echoed.is_none()
        {
            entry.echoed = Some(Instant::now());
        }
    }

    /// Like [`WriteMemo::forget`] for a watch event of `key` at `version`; true when that is
    /// the event of our own last write, still awaited: the cache now shows exactly what was
    /// written and nothing else happened to the object, so the event has nothing to decide.
    pub fn echo(&self, key: &ObjectKey, version: Option<&str>) -> bool {
        let mut inner = self.0.lock().expect("write memo");
        let Some(entry) = inner.entries.get_mut(key) else {
            return false;
        };
        if entry.echoed.is_some() {
            return false;
        }
        entry.echoed = Some(Instant::now());
        version.is_some() && entry.version.as_deref() == version
    }

    /// How many writes are waiting for their watch event (a gauge for leaks in tests).
    pub fn len(&self) -> usize {
        let inner = self.0.lock().expect("write memo");
        inner
            .entries
            .values()
            .filter(|e| e.echoed.is_none())
            .count()
    }

    /// Whether no write is waiting for its watch event.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Secret;

    fn fp(version: &str, desired: &str) -> Fingerprint {
        Fingerprint {
            live_version: Some(version.into()),
            desired: desired.into(),
        }
    }

    #[test]
    fn a_write_is_remembered_until_its_watch_event() {
        let memo = WriteMemo::default();
        let key = ObjectKey::of::<Secret>(Some("c1"), "db");
        memo.record(
            key.clone(),
            fp("1", "h"),
            Some("u".into()),
            Some("2".into()),
        );
        assert_eq!(memo.written(&key, &fp("1", "h")), Some(Some("u".into())));
        // Other content, or a cache that moved on: decide again.
        assert_eq!(memo.written(&key, &fp("1", "other")), None);
        assert_eq!(memo.written(&key, &fp("2", "h")), None);
        memo.forget(&key);
        assert!(memo.is_empty());
        // After the echo only a decision on the version the write replaced is still answered
        // (a reconcile that read the cache just before the echo); anything else decides anew.
        assert_eq!(memo.written(&key, &fp("1", "h")), Some(Some("u".into())));
        assert_eq!(memo.written(&key, &fp("2", "h")), None);
        assert_eq!(memo.written(&key, &fp("1", "other")), None);
    }

    #[test]
    fn an_echoed_creation_is_not_answered_for_an_uncached_object() {
        // "Not cached" after the echo may mean deleted since: it must be written again.
        let memo = WriteMemo::default();
        let key = ObjectKey::of::<Secret>(Some("c1"), "db");
        let created = Fingerprint {
            live_version: None,
            desired: "h".into(),
        };
        memo.record(key.clone(), created.clone(), Some("u".into()), None);
        assert_eq!(memo.written(&key, &created), Some(Some("u".into())));
        memo.forget(&key);
        assert_eq!(memo.written(&key, &created), None);
    }

    #[test]
    fn only_the_first_event_at_the_written_version_is_our_echo() {
        let memo = WriteMemo::default();
        let key = ObjectKey::of::<Secret>(Some("c1"), "db");
        // Nothing written: any event is news.
        assert!(!memo.echo(&key, Some("5")));
        memo.record(key.clone(), fp("1", "h"), None, Some("5".into()));
        assert!(memo.echo(&key, Some("5")));
        assert!(memo.is_empty(), "the echo retires the entry like forget");
        // The same version again (a re-delivery) or a later one is not awaited any more.
        assert!(!memo.echo(&key, Some("5")));
        memo.record(key.clone(), fp("5", "h2"), None, Some("7".into()));
        // Someone else's write in between: a different version, decided by the cache.
        assert!(!memo.echo(&key, Some("6")));
        assert!(
            !memo.echo(&key, Some("7")),
            "already echoed by the event before it"
        );
        memo.record(key.clone(), fp("7", "h3"), None, None);
        assert!(!memo.echo(&key, None), "no version written, none matched");
    }

    #[test]
    fn keys_are_typed_not_strings() {
        let memo = WriteMemo::default();
        let secret = ObjectKey::of::<Secret>(Some("c1"), "db");
        let config_map = ObjectKey::of::<k8s_openapi::api::core::v1::ConfigMap>(Some("c1"), "db");
        memo.record(secret.clone(), fp("1", "h"), None, None);
        assert_eq!(memo.written(&config_map, &fp("1", "h")), None);
        assert_eq!(memo.written(&secret, &fp("1", "h")), Some(None));
    }
}
