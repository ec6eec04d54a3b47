//! One object downstream: observe it, let [`plan::object_plan`] decide, hand the operations to
//! the executor, and report the object's state. Also the namespaces objects land in.

use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef as KubeRef;
use serde_json::Value;
use tender_runtime::reconcile::{error_text, is_not_found};
use tender_runtime::{Executor, ObjectKey, Op};
use tender_types::{ObjectRef, ObjectState, ObjectStatus};

use tender_types::conditions::reason;

use crate::context::Context;
use crate::downstream::{self, message};
use crate::plan::{self, Desired, Mode, ObjectPlan, Owner};

/// Why the existing object `live` may not be adopted: only an unmanaged one is ever adopted,
/// and never one of tender's own.
fn adoption_refusal(ctx: &Context, d: &Desired, owner: &Owner, live: &Value) -> Option<String> {
    let meta = |field: &str| -> Option<std::collections::BTreeMap<String, String>> {
        serde_json::from_value(live["metadata"][field].clone()).unwrap_or_default()
    };
    (plan::ownership(meta("annotations").as_ref(), owner) == plan::Ownership::Unowned)
        .then(|| {
            crate::policy::Policy::adoption_refusal(
                &d.key,
                meta("labels").as_ref(),
                &ctx.config.agent_namespace,
            )
        })
        .flatten()
}

/// Brings one object in line with `d` (or reports why not) and returns its state; an object
/// restored after drift is added to `corrected`.
pub(crate) async fn sync_object(
    ctx: &Context,
    writer: &Executor,
    d: &Desired,
    owner: &Owner,
    mode: Mode,
    corrected: &mut Vec<ObjectRef>,
) -> ObjectStatus {
    let error = |msg: String| ObjectStatus::new(&d.key, ObjectState::Error, Some(msg));
    let (key, api) = match ctx.down.locate(&d.key).await {
        Ok(x) => x,
        Err(e) => return error(downstream::unresolved(&d.key.api_version, &d.key.kind, &e)),
    };
    // Observe: the cache of managed objects, else the apiserver (absent, or not ours).
    let live = match ctx.drift.cached(&key) {
        Some(cached) => Some(serde_json::to_value(cached.as_ref()).unwrap_or_default()),
        None => match api.get_opt(&d.key.name).await {
            Ok(live) => live.map(|o| serde_json::to_value(o).unwrap_or_default()),
            Err(e) => {
                let msg = format!("cannot read: {}", error_text(&e, key.is_secret()));
                return error(unless_gone(ctx, d, &key, is_not_found(&e), msg).await);
            }
        },
    };
    // takeOwnership never adopts tender's own objects, whatever the policy flags
    // (decision 0078-tenders-own-objects-and-protected-namespaces).
    if mode.take_ownership
        && let Some(live) = &live
        && let Some(why) = adoption_refusal(ctx, d, owner, live)
    {
        return error(why);
    }
    let (ops, corrects_drift) = match plan::object_plan(d, &key, live.as_ref(), owner, mode) {
        ObjectPlan::Settled { state, message } => {
            match state {
                ObjectState::Conflict => ctx.metrics.conflict(),
                ObjectState::Missing | ObjectState::Modified => ctx.metrics.drift(false),
                _ => {}
            }
            return ObjectStatus::new(&d.key, state, message);
        }
        ObjectPlan::Write {
            ops,
            corrects_drift,
        } => (ops, corrects_drift),
    };
    let mut applied: Option<Value> = None;
    let mut wrote = false;
    for op in ops {
        let action = action(&op);
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
            }
            Err(e) => return error(unless_gone(ctx, d, &key, e.is_not_found(), message(&e)).await),
        }
    }
    // A write the memo skipped restored nothing: the cache only had not yet seen our own last
    // write (a rotation's, under a slow watch), so it is not reported as drift.
    if corrects_drift && wrote {
        ctx.metrics.drift(true);
        corrected.push(d.key.clone());
        tracing::info!(object = %d.key, "restored after downstream drift");
    }
    ctx.drift.ensure(&key.resource);
    // A write the executor skipped is judged on what the cache shows, else on the desired
    // body, always as its kind ([`plan::judge`]).
    let (state, message) = plan::judge(applied.or(live), d);
    ObjectStatus::new(&d.key, state, message)
}

/// `msg`, unless the request failed with a 404 because the kind is no longer served (its CRD
/// removed): then discovery is asked again and the message says `KindNotInstalled`.
async fn unless_gone(
    ctx: &Context,
    d: &Desired,
    key: &ObjectKey,
    not_found: bool,
    msg: String,
) -> String {
    if !not_found {
        return msg;
    }
    ctx.down.forget(&d.key.api_version, &d.key.kind);
    match ctx.down.resolve(&d.key.api_version, &d.key.kind).await {
        Err(gone) if downstream::not_installed(&gone) => {
            // The object went with its kind: our last write of it must not skip the next.
            ctx.down_writer.memo().forget(key);
            downstream::unresolved(&d.key.api_version, &d.key.kind, &gone)
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
