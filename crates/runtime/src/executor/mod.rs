//! The one executor every reconciler hands its operations to.
//!
//! Reconcilers observe (caches), plan (pure functions returning [`Op`]s) and hand the list
//! here. The executor owns how a write is made: server-side apply with the process's field
//! manager, a 404 on delete counting as done, recreate when the apiserver refuses an
//! immutable change (waiting with kube's `await_condition` until the old object is gone),
//! the skip-unchanged [`WriteMemo`], write metrics, bounded concurrency, and errors that never
//! quote Secret data.

mod memo;
mod ops;

use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, StreamExt};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event, Recorder};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, ResourceExt};
use serde_json::Value;

pub use memo::WriteMemo;
pub use ops::{Apply, EventOp, Fingerprint, ObjectKey, Op, Outcome};

use crate::Metrics;
use crate::reconcile::{ReconcileError, is_not_found};

/// How long a recreate waits for the old object to disappear.
const REPLACE_WAIT: Duration = Duration::from_secs(10);

/// Carries out [`Op`]s against one apiserver as one field manager.
pub struct Executor {
    client: Client,
    field_manager: String,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    memo: WriteMemo,
}

impl Executor {
    /// An executor writing through `client` as `field_manager`, publishing events with
    /// `recorder` and counting writes into `metrics`.
    pub fn new(
        client: Client,
        field_manager: &str,
        recorder: Recorder,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            client,
            field_manager: field_manager.to_string(),
            recorder,
            metrics,
            memo: WriteMemo::default(),
        }
    }

    /// The skip-unchanged memo; watch feeds call [`WriteMemo::forget`] for every event.
    pub fn memo(&self) -> &WriteMemo {
        &self.memo
    }

    /// The client the executor writes with.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Carries out `ops` with at most `concurrency` in flight; results in the order given.
    pub async fn execute_all(
        &self,
        ops: Vec<Op>,
        concurrency: usize,
    ) -> Vec<Result<Outcome, ReconcileError>> {
        stream::iter(ops.into_iter().map(|op| self.execute(op)))
            .buffered(concurrency.max(1))
            .collect()
            .await
    }

    /// Carries out `ops` one after the other, stopping at the first error.
    pub async fn execute_in_order(&self, ops: Vec<Op>) -> Result<Vec<Outcome>, ReconcileError> {
        let mut out = Vec::with_capacity(ops.len());
        for op in ops {
            out.push(self.execute(op).await?);
        }
        Ok(out)
    }

    /// Carries out one operation.
    pub async fn execute(&self, op: Op) -> Result<Outcome, ReconcileError> {
        let verb = op.verb();
        match op {
            Op::Apply(apply) => self.apply(verb, apply, false).await,
            Op::ApplyStatus(apply) => self.apply(verb, apply, true).await,
            Op::MergePatch { key, patch } => {
                let object = self
                    .api(&key)
                    .patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(|e| failed("patch", &key, e))?;
                self.metrics.object_write(verb, key.kind());
                Ok(written(object))
            }
            Op::Delete { key, uid } => {
                let deleted = self.delete(&key, uid).await?;
                if deleted {
                    self.metrics.object_write(verb, key.kind());
                }
                Ok(Outcome {
                    wrote: deleted,
                    ..Default::default()
                })
            }
            Op::Recreate { uid, apply } => {
                self.replace(&apply.key, uid).await?;
                self.metrics.object_write(verb, apply.key.kind());
                self.apply("apply", apply, false).await
            }
            Op::Event(event) => {
                self.publish(event).await;
                Ok(Outcome::default())
            }
        }
    }

    fn api(&self, key: &ObjectKey) -> Api<DynamicObject> {
        match &key.namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &key.resource),
            None => Api::all_with(self.client.clone(), &key.resource),
        }
    }

    async fn apply(
        &self,
        verb: &'static str,
        apply: Apply,
        status: bool,
    ) -> Result<Outcome, ReconcileError> {
        let Apply {
            key,
            body,
            replace_if_immutable,
            fingerprint,
        } = apply;
        if let Some(fp) = &fingerprint
            && let Some(uid) = self.memo.written(&key, fp)
        {
            self.metrics.object_write_skipped(verb, key.kind());
            return Ok(Outcome {
                wrote: false,
                uid,
                object: None,
            });
        }
        let api = self.api(&key);
        let params = PatchParams::apply(&self.field_manager).force();
        let result = if status {
            api.patch_status(&key.name, &params, &Patch::Apply(&body))
                .await
        } else {
            api.patch(&key.name, &params, &Patch::Apply(&body)).await
        };
        let object = match result {
            Ok(object) => object,
            Err(kube::Error::Api(s)) if s.code == 422 && replace_if_immutable && !status => {
                // An immutable object (or a Secret's type) cannot change in place.
                tracing::info!(object = %key, "cannot be updated in place (immutable field); recreating");
                self.replace(&key, None).await?;
                self.metrics.object_write("recreate", key.kind());
                api.patch(&key.name, &params, &Patch::Apply(&body))
                    .await
                    .map_err(|e| failed("recreate", &key, e))?
            }
            Err(e) => {
                return Err(failed(
                    if status { "write status of" } else { "apply" },
                    &key,
                    e,
                ));
            }
        };
        self.metrics.object_write(verb, key.kind());
        let outcome = written(object);
        if let Some(fp) = fingerprint {
            self.memo.record(key, fp, outcome.uid.clone());
        }
        Ok(outcome)
    }

    /// Deletes `key` (only incarnation `uid` when given); false when it was already gone.
    async fn delete(&self, key: &ObjectKey, uid: Option<String>) -> Result<bool, ReconcileError> {
        let params = DeleteParams {
            preconditions: uid.map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        match self.api(key).delete(&key.name, &params).await {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            // The uid precondition failed: a newer object of that name is not ours to delete.
            Err(kube::Error::Api(s)) if s.code == 409 && params.preconditions.is_some() => {
                Ok(false)
            }
            Err(e) => Err(failed("delete", key, e)),
        }
    }

    /// Deletes `key` and waits until that incarnation is gone.
    async fn replace(&self, key: &ObjectKey, uid: Option<String>) -> Result<(), ReconcileError> {
        let api = self.api(key);
        let uid = match uid {
            Some(uid) => uid,
            None => match api.get_opt(&key.name).await {
                Ok(Some(live)) => live.uid().unwrap_or_default(),
                Ok(None) => return Ok(()),
                Err(e) => return Err(failed("read", key, e)),
            },
        };
        self.delete(key, Some(uid.clone())).await?;
        let gone = await_condition(api, &key.name, conditions::is_deleted(&uid));
        match tokio::time::timeout(REPLACE_WAIT, gone).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => {
                tracing::warn!(object = %key, %error, "watching a replaced object failed");
                Err(ReconcileError::ReplaceTimeout {
                    object: key.to_string(),
                })
            }
            Err(_) => Err(ReconcileError::ReplaceTimeout {
                object: key.to_string(),
            }),
        }
    }

    async fn publish(&self, event: EventOp) {
        let note: String = event.note.chars().take(1000).collect();
        let ev = Event {
            type_: event.type_,
            reason: event.reason.clone(),
            note: Some(note),
            action: event.action,
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&ev, &event.regarding).await {
            tracing::warn!(%error, reason = %event.reason, object = ?event.regarding.name, "cannot publish event");
        }
    }
}

fn written(object: DynamicObject) -> Outcome {
    let uid = object.uid();
    Outcome {
        wrote: true,
        uid,
        object: serde_json::to_value(object).ok().filter(|v| !v.is_null()),
    }
}

fn failed(what: &str, key: &ObjectKey, error: kube::Error) -> ReconcileError {
    ReconcileError::kube(format!("{what} {key}"), key.is_secret(), error)
}

/// The JSON `body` of a typed object with `apiVersion` and `kind` set, for [`Apply::body`].
pub fn body_of<K>(object: &K) -> Value
where
    K: kube::Resource<DynamicType = ()> + serde::Serialize,
{
    let mut value = serde_json::to_value(object).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut value {
        map.insert("apiVersion".into(), K::api_version(&()).into());
        map.insert("kind".into(), K::kind(&()).into());
    }
    value
}
