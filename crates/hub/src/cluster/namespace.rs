//! A Cluster's namespace on the hub, created by the hub and recorded on the Cluster so only
//! that namespace is ever written into or deleted
//! (decision 0074-cluster-namespaces-provably-the-hubs; the rule itself is
//! [`tender_types::ownership`]).

use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::Api;
use tender_runtime::executor::{ObjectKey, Op};
use tender_types::ownership::{Ownership, ownership, pending_record};
use tender_types::{Cluster, labels};

use super::Provisioned;
use crate::context::Ctx;
use crate::{Error, kube_err};

/// Reads the derived namespace of `cluster` fresh and says whose it is
/// (decision 0074-cluster-namespaces-provably-the-hubs); its uid.
pub(super) async fn namespace_ownership(
    ctx: &Ctx,
    cluster: &Cluster,
    ns_name: &str,
) -> Result<(Ownership, Option<String>), Error> {
    let live = Api::<Namespace>::all(ctx.client.clone())
        .get_metadata_opt(ns_name)
        .await
        .map_err(kube_err(format!("read namespace {ns_name}")))?;
    let claim = live
        .as_ref()
        .and_then(|m| m.labels().get(labels::NAMESPACE_CLAIM).cloned());
    let uid = live.and_then(|m| m.uid());
    let judge = |recorded: Option<&str>| ownership(recorded, uid.as_deref(), claim.as_deref());
    let recorded = cluster.annotations().get(labels::NAMESPACE_UID);
    let owner = judge(recorded.map(String::as_str));
    if matches!(owner, Ownership::Absent | Ownership::Ours) {
        return Ok((owner, uid));
    }
    // The record may be newer than the Cluster this reconcile was handed (written a moment
    // ago by the reconcile that created the namespace): read the Cluster itself before
    // calling the namespace somebody else's, or recording a uid already recorded.
    let workspace = cluster.namespace().unwrap_or_default();
    let fresh = Api::<Cluster>::namespaced(ctx.client.clone(), &workspace)
        .get_metadata_opt(&cluster.name_any())
        .await
        .map_err(kube_err(format!(
            "read Cluster {workspace}/{}",
            cluster.name_any()
        )))?;
    let recorded = fresh
        .as_ref()
        .and_then(|m| m.annotations().get(labels::NAMESPACE_UID).cloned());
    Ok((judge(recorded.as_deref()), uid))
}

/// Records `value` as the Cluster's namespace record (metadata: an agent's credential cannot
/// write it).
pub(super) async fn record_namespace(
    ctx: &Ctx,
    cluster: &Cluster,
    value: &str,
) -> Result<(), Error> {
    let workspace = cluster.namespace().unwrap_or_default();
    ctx.exec
        .execute(Op::MergePatch {
            key: ObjectKey::of::<Cluster>(Some(&workspace), &cluster.name_any()),
            patch: serde_json::json!({"metadata": {"annotations": {labels::NAMESPACE_UID: value}}}),
        })
        .await?;
    Ok(())
}

/// Creates the cluster namespace with a fresh random claim (recorded first, as its hash) and
/// then records its uid. `false`: somebody else created it first.
pub(super) async fn create_namespace(
    ctx: &Ctx,
    cluster: &Cluster,
    mut namespace: Provisioned,
) -> Result<bool, Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| Error::Config(format!("no randomness for a namespace claim: {e}")))?;
    let claim: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    record_namespace(ctx, cluster, &pending_record(&claim)).await?;
    namespace.body["metadata"]["labels"][labels::NAMESPACE_CLAIM] = serde_json::json!(claim);
    let created = ctx
        .exec
        .execute(Op::Create {
            key: namespace.key,
            body: namespace.body,
        })
        .await?;
    let Some(uid) = created.uid.filter(|_| created.wrote) else {
        return Ok(false);
    };
    record_namespace(ctx, cluster, &uid).await?;
    Ok(true)
}
