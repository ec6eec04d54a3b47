//! The skip-unchanged memo: what the executor last wrote to an object, keyed by a typed
//! reference, until the watch that feeds the plan's cache catches up.

use std::collections::HashMap;
use std::sync::Mutex;

use super::ops::{Fingerprint, ObjectKey};

/// Remembers, per object, the cached resourceVersion a write was decided on, the content
/// written and the uid it produced. Until the cache moves past that version, a reconcile
/// reading the cache sees the old object and would write the same content again; the memo
/// tells the executor not to. The watch feed calls [`WriteMemo::forget`] for every event, so
/// an entry lives only between a write and its echo (and a changed object is decided anew).
#[derive(Debug, Default)]
pub struct WriteMemo(Mutex<HashMap<ObjectKey, Entry>>);

#[derive(Debug, Clone)]
struct Entry {
    fingerprint: Fingerprint,
    uid: Option<String>,
}

impl WriteMemo {
    /// The uid written, if the same content was written over the same cached version.
    /// `Some(None)` means "written, uid unknown".
    pub fn written(&self, key: &ObjectKey, fingerprint: &Fingerprint) -> Option<Option<String>> {
        let map = self.0.lock().expect("write memo");
        let entry = map.get(key)?;
        (entry.fingerprint == *fingerprint).then(|| entry.uid.clone())
    }

    /// Records a write.
    pub fn record(&self, key: ObjectKey, fingerprint: Fingerprint, uid: Option<String>) {
        self.0
            .lock()
            .expect("write memo")
            .insert(key, Entry { fingerprint, uid });
    }

    /// Forgets `key`: its watch event reached the cache, which decides again from now on.
    pub fn forget(&self, key: &ObjectKey) {
        self.0.lock().expect("write memo").remove(key);
    }

    /// How many writes are waiting for their watch event (a gauge for leaks in tests).
    pub fn len(&self) -> usize {
        self.0.lock().expect("write memo").len()
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
        memo.record(key.clone(), fp("1", "h"), Some("u".into()));
        assert_eq!(memo.written(&key, &fp("1", "h")), Some(Some("u".into())));
        // Other content, or a cache that moved on: decide again.
        assert_eq!(memo.written(&key, &fp("1", "other")), None);
        assert_eq!(memo.written(&key, &fp("2", "h")), None);
        memo.forget(&key);
        assert_eq!(memo.written(&key, &fp("1", "h")), None);
        assert!(memo.is_empty());
    }

    #[test]
    fn keys_are_typed_not_strings() {
        let memo = WriteMemo::default();
        let secret = ObjectKey::of::<Secret>(Some("c1"), "db");
        let config_map = ObjectKey::of::<k8s_openapi::api::core::v1::ConfigMap>(Some("c1"), "db");
        memo.record(secret.clone(), fp("1", "h"), None);
        assert_eq!(memo.written(&config_map, &fp("1", "h")), None);
        assert_eq!(memo.written(&secret, &fp("1", "h")), Some(None));
    }
}
