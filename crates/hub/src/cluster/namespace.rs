//! Whether a Cluster's namespace on the hub is the hub's own (decision 74). Pure.
//!
//! The name is derived from (workspace, Cluster name), so anybody who may create namespaces
//! can create it first. The hub therefore creates the namespace itself and records the uid
//! the apiserver gave it on the Cluster (metadata, which an agent's credential cannot write);
//! only a namespace of that uid is written into or deleted.

/// What the hub may do with the namespace its Cluster's name derives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// No such namespace: create it, then record its uid.
    Absent,
    /// The namespace the hub created for this Cluster.
    Ours,
    /// Somebody else's (or the hub's, but the record of it was lost): never written into,
    /// never deleted.
    NotOurs,
}

/// The ownership of a namespace whose uid is `live_uid` (`None`: absent) for a Cluster that
/// records `recorded` (its [`tender_types::labels::NAMESPACE_UID`] annotation).
pub fn ownership(recorded: Option<&str>, live_uid: Option<&str>) -> Ownership {
    match live_uid {
        None => Ownership::Absent,
        Some(uid) if !uid.is_empty() && recorded == Some(uid) => Ownership::Ours,
        Some(_) => Ownership::NotOurs,
    }
}

/// The Ready message of a Cluster whose namespace is not the hub's own.
pub fn not_owned_message(namespace: &str) -> String {
    format!(
        "namespace {namespace} exists but tender did not create it for this Cluster; nothing is \
         provisioned or written there and it is never deleted. Delete or rename that namespace \
         (or this Cluster) and tender creates its own"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_recorded_uid_is_ours() {
        assert_eq!(ownership(None, None), Ownership::Absent);
        assert_eq!(ownership(Some("u1"), None), Ownership::Absent);
        assert_eq!(ownership(Some("u1"), Some("u1")), Ownership::Ours);
        // Pre-created by a tenant, or recreated by somebody after the hub's was deleted.
        assert_eq!(ownership(None, Some("u1")), Ownership::NotOurs);
        assert_eq!(ownership(Some("u1"), Some("u2")), Ownership::NotOurs);
        assert_eq!(ownership(Some(""), Some("")), Ownership::NotOurs);
    }
}
