//! One object downstream: carry out the operations the plan decided for it
//! ([`plan::decide`]) and judge the object the apiserver returned. Also the namespaces objects
//! land in.

use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use kube::discovery::ApiResource;
use kube::runtime::reflector::ObjectRef as KubeRef;
use serde_json::Value;
use tender_runtime::reconcile::error_text;
use tender_runtime::{Executor, ObjectKey, Op};
use tender_types::{ObjectRef, ObjectState, ObjectStatus};

use tender_types::conditions::reason;

use crate::context::Context;
use crate::downstream::{self, message};
use crate::plan::{self, Write};

/// Carries out the operations decided for one object and returns its state; an object
/// restored after drift is added to `corrected`, its kind to `watch` (for the report step).
pub(crate) async fn write_object(
    ctx: &Context,
    writer: &Executor,
    w: &Write,
    corrected: &mut Vec<ObjectRef>,
    watch: &mut Vec<ApiResource>,
) -> ObjectStatus {
    let d = &w.desired;
    let mut applied: Option<Value> = None;
    let mut wrote = false;
    let mut key = None;
    for op in w.ops.iter().cloned() {
        let action = action(&op);
        let op_key = op.key().cloned();
        match writer.execute(op).await {
            Ok(outcome) => {
                wrote |= outcome.wrote;
                if outcome.wrote {
                    for action in action {
                        ctx.metrics.written(action, &d.key.kind);
                    }
                }
                applied = outcome
                    .object
                    .map(|o| serde_json::to_value(o).unwrap_or_default())
                    .or(applied);
                key = key.or(op_key);
            }
            Err(e) => {
                let msg = message(&e);
                let msg = match op_key {
                    Some(k) => unless_gone(ctx, &d.key, &k, e.is_not_found(), msg).await,
                    None => msg,
                };
                return ObjectStatus::new(&d.key, ObjectState::Error, Some(msg));
            }
        }
    }
    // A write the memo skipped restored nothing: the cache only had not yet seen our own last
    // write (a rotation's, under a slow watch), so it is not reported as drift.
    if w.corrects_drift && wrote {
        ctx.metrics.drift(true);
        corrected.push(d.key.clone());
        tracing::info!(object = %d.key, "restored after downstream drift");
    }
    watch.extend(key.map(|k| k.resource));
    // A write the executor skipped is judged on what the cache shows, else on the desired
    // body, always as its kind ([`plan::judge`]).
    let (state, message) = plan::judge(applied.or_else(|| w.live.clone()), d);
    ObjectStatus::new(&d.key, state, message)
}

/// Counts a state decided without a write (conflict, drift left alone) and returns it.
pub(crate) fn settled(ctx: &Context, status: &ObjectStatus) -> ObjectStatus {
    match status.state {
        ObjectState::Conflict => ctx.metrics.conflict(),
        ObjectState::Missing | ObjectState::Modified => ctx.metrics.drift(false),
        _ => {}
    }
    status.clone()
}

/// `msg`, unless the request failed with a 404 because the kind is no longer served (its CRD
/// removed): then discovery is asked again and the message says `KindNotInstalled`.
pub(crate) async fn unless_gone(
    ctx: &Context,
    r: &ObjectRef,
    key: &ObjectKey,
    not_found: bool,
    msg: String,
) -> String {
    if !not_found {
        return msg;
    }
    ctx.down.forget(&r.api_version, &r.kind);
    match ctx.down.resolve(&r.api_version, &r.kind).await {
        Err(gone) if downstream::not_installed(&gone) => {
            // The object went with its kind: our last write of it must not skip the next.
            ctx.down_writer.memo().forget(key);
            downstream::unresolved(&r.api_version, &r.kind, &gone)
        }
        _ => msg,
    }
}

/// What `tender_agent_objects_written_total` counts for an operation that wrote.
fn action(op: &Op) -> &'static [&'static str] {
    match op {
        Op::Apply(_) => &["apply"],
        Op::Recreate { .. } => &["recreate", "apply"],
        // Dropping keys other managers added to a copy is part of its apply.
        _ => &[],
    }
}

/// Makes sure namespace `ns` exists downstream (and is not being deleted); `Err` is the message
/// for the objects that would land in it.
pub(crate) async fn ensure_namespace(
    ctx: &Context,
    writer: &Executor,
    ns: &str,
    meta: plan::NamespaceMeta<'_>,
) -> Result<(), String> {
    let terminating = || {
        Err(format!(
            "{}: namespace {ns} is being deleted downstream; its objects wait until it is gone",
            reason::NAMESPACE_TERMINATING
        ))
    };
    // The namespace cache follows every change downstream, so a namespace it holds needs no
    // read (one per reconcile, most of them finding nothing to do). If it went a moment ago,
    // the write into it fails and is retried. Only one the cache has not seen is read.
    if let Some(cached) = ctx.namespaces.get(&KubeRef::new(ns)) {
        return match cached.metadata.deletion_timestamp {
            Some(_) => terminating(),
            None => Ok(()),
        };
    }
    let api: Api<Namespace> = Api::all(ctx.down.client.clone());
    match api.get_opt(ns).await {
        Ok(Some(n)) if n.metadata.deletion_timestamp.is_some() => terminating(),
        Ok(Some(_)) => Ok(()),
        Ok(None) => {
            ctx.metrics.written("apply", "Namespace");
            writer
                .execute(plan::namespace_op(ns, meta))
                .await
                .map(drop)
                .map_err(|e| message(&e))
        }
        Err(e) => Err(format!(
            "cannot read namespace {ns}: {}",
            error_text(&e, false)
        )),
    }
}
