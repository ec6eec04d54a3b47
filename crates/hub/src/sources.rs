//! The index from source Secrets/ConfigMaps to the Bundles that copy them.
//!
//! Sources are watched as metadata only (no Secret data in memory); an event on one is mapped
//! through this index to its Bundles, which then GET the few objects they reference.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use tender_types::copy::CopyableKind;

/// A source object: (namespace — empty for a cluster-scoped kind, kind, name).
pub type SourceId = (String, CopyableKind, String);
/// A Bundle: (namespace, name).
pub type BundleId = (String, String);

/// Source → Bundles index, filled by the Bundle reconciler before it reads any source, so an
/// event on a source after that read always reaches the Bundle.
#[derive(Debug, Default)]
pub struct SourceIndex {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    by_source: HashMap<SourceId, BTreeSet<BundleId>>,
    by_bundle: HashMap<BundleId, BTreeSet<SourceId>>,
}

impl SourceIndex {
    /// Records that `bundle` references exactly `sources` (replacing what it referenced before).
    pub fn set(&self, bundle: &BundleId, sources: BTreeSet<SourceId>) {
        let mut inner = self.inner.lock().expect("source index lock");
        let old = inner.by_bundle.remove(bundle).unwrap_or_default();
        for source in old.difference(&sources) {
            if let Some(set) = inner.by_source.get_mut(source) {
                set.remove(bundle);
                if set.is_empty() {
                    inner.by_source.remove(source);
                }
            }
        }
        for source in &sources {
            inner
                .by_source
                .entry(source.clone())
                .or_default()
                .insert(bundle.clone());
        }
        if !sources.is_empty() {
            inner.by_bundle.insert(bundle.clone(), sources);
        }
    }

    /// Forgets a deleted Bundle.
    pub fn remove(&self, bundle: &BundleId) {
        self.set(bundle, BTreeSet::new());
    }

    /// The Bundles that reference `source`.
    pub fn bundles_for(&self, source: &SourceId) -> Vec<BundleId> {
        let inner = self.inner.lock().expect("source index lock");
        inner
            .by_source
            .get(source)
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Number of indexed sources (for tests and debugging).
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .expect("source index lock")
            .by_source
            .len()
    }

    /// Whether no source is indexed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(kind: &str) -> CopyableKind {
        CopyableKind::parse(&format!("v1/{kind}")).unwrap()
    }
    fn src(name: &str) -> SourceId {
        ("ws".into(), kind("Secret"), name.into())
    }
    fn bundle(name: &str) -> BundleId {
        ("ws".into(), name.into())
    }

    #[test]
    fn maps_sources_to_bundles_and_follows_changes() {
        let index = SourceIndex::default();
        index.set(&bundle("a"), BTreeSet::from([src("s1"), src("s2")]));
        index.set(&bundle("b"), BTreeSet::from([src("s1")]));
        assert_eq!(index.bundles_for(&src("s1")), [bundle("a"), bundle("b")]);
        assert_eq!(index.bundles_for(&src("s2")), [bundle("a")]);

        index.set(&bundle("a"), BTreeSet::from([src("s1")]));
        assert!(index.bundles_for(&src("s2")).is_empty(), "entry removed");
        assert_eq!(index.len(), 1);

        index.remove(&bundle("a"));
        index.remove(&bundle("b"));
        assert!(index.is_empty());
        assert!(
            index
                .bundles_for(&("ws".into(), kind("ConfigMap"), "s1".into()))
                .is_empty(),
            "kinds are distinct"
        );
    }
}
