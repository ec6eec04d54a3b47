//! Whether a Cluster's namespace on the hub is the hub's own
//! (decision 0074-cluster-namespaces-provably-the-hubs). Pure.
//!
//! The name is derived from (workspace, Cluster name), so anybody who may create namespaces
//! can create it first. The hub therefore creates the namespace itself and records the uid
//! the apiserver gave it on the Cluster (metadata, which an agent's credential cannot write);
//! only a namespace of that uid is written into or deleted. Creating and recording are two
//! writes: before the first the Cluster records `pending:<sha256 of a random claim>` and the
//! namespace is created with the claim as a label, so a hub stopped between them recognises
//! its namespace (nobody else can label a namespace with a claim only its hash was shown of).

/// What the hub may do with the namespace its Cluster's name derives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// No such namespace: create it, then record its uid.
    Absent,
    /// The namespace the hub created for this Cluster.
    Ours,
    /// The namespace the hub created for this Cluster, its uid not recorded yet (the hub
    /// stopped between creating and recording): record it.
    Claimed,
    /// Somebody else's (or the hub's, but the record of it was lost): never written into,
    /// never deleted.
    NotOurs,
}

/// Prefix of a Cluster's record while its namespace is being created.
pub const PENDING: &str = "pending:";

/// The record a Cluster holds while its namespace is created with `claim`.
pub fn pending_record(claim: &str) -> String {
    format!("{PENDING}{}", crate::hash::sha256_hex(claim.as_bytes()))
}

/// The ownership of a namespace whose uid is `live_uid` (`None`: absent) and whose claim label
/// is `live_claim`, for a Cluster that records `recorded` (its
/// [`crate::labels::NAMESPACE_UID`] annotation).
pub fn ownership(
    recorded: Option<&str>,
    live_uid: Option<&str>,
    live_claim: Option<&str>,
) -> Ownership {
    match live_uid {
        None => Ownership::Absent,
        Some(uid) if !uid.is_empty() && recorded == Some(uid) => Ownership::Ours,
        Some(_)
            if live_claim
                .is_some_and(|c| !c.is_empty() && recorded == Some(pending_record(c).as_str())) =>
        {
            Ownership::Claimed
        }
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
    fn only_the_recorded_uid_or_claim_is_ours() {
        assert_eq!(ownership(None, None, None), Ownership::Absent);
        assert_eq!(ownership(Some("u1"), None, None), Ownership::Absent);
        assert_eq!(ownership(Some("u1"), Some("u1"), None), Ownership::Ours);
        // Pre-created by a tenant, or recreated by somebody after the hub's was deleted.
        assert_eq!(ownership(None, Some("u1"), None), Ownership::NotOurs);
        assert_eq!(ownership(Some("u1"), Some("u2"), None), Ownership::NotOurs);
        assert_eq!(ownership(Some(""), Some(""), None), Ownership::NotOurs);
        // The hub stopped between creating (with its claim) and recording the uid.
        let pending = pending_record("c0ffee");
        assert_eq!(
            ownership(Some(&pending), Some("u1"), Some("c0ffee")),
            Ownership::Claimed
        );
        // A tenant sees the pending record, not the claim: any other label is not it.
        assert_eq!(
            ownership(Some(&pending), Some("u1"), Some(&pending)),
            Ownership::NotOurs
        );
        assert_eq!(
            ownership(Some(&pending), Some("u1"), None),
            Ownership::NotOurs
        );
        assert_eq!(
            ownership(Some(&pending_record("")), Some("u1"), Some("")),
            Ownership::NotOurs
        );
    }
}
