use super::*;
use tender_types::{BundleShardStatus, BundleStatus, BundleSummary};

fn bundle(generation: i64, shards: Vec<BundleShardStatus>, ready: i32) -> Bundle {
    let mut b: Bundle = serde_json::from_value(serde_json::json!({
        "apiVersion": "tender.dev/v1alpha1", "kind": "Bundle",
        "metadata": {"name": "app", "namespace": "ws", "generation": generation},
        "spec": {}
    }))
    .unwrap();
    let mut status = BundleStatus {
        shards,
        ..Default::default()
    };
    status.summary = Some(BundleSummary {
        ready,
        ..Default::default()
    });
    b.status = Some(status);
    b
}

fn entry(id: &str, ready: i32) -> BundleShardStatus {
    let mut e = BundleShardStatus {
        id: id.into(),
        ..Default::default()
    };
    e.summary.ready = ready;
    e
}

#[test]
fn a_shard_wakes_for_spec_and_its_own_entry_not_for_the_others() {
    let base = shard_wake_key(&bundle(1, vec![entry("a", 1), entry("b", 1)], 2), "a");
    // Another shard's entry and the folded summary: no wake.
    let others = bundle(1, vec![entry("a", 1), entry("b", 2)], 3);
    assert_eq!(shard_wake_key(&others, "a"), base);
    // A new generation, or its own entry changed or removed: wake.
    assert_ne!(
        shard_wake_key(&bundle(2, vec![entry("a", 1), entry("b", 1)], 2), "a"),
        base
    );
    assert_ne!(
        shard_wake_key(&bundle(1, vec![entry("a", 2), entry("b", 1)], 2), "a"),
        base
    );
    assert_ne!(
        shard_wake_key(&bundle(1, vec![entry("b", 1)], 2), "a"),
        base
    );
}
