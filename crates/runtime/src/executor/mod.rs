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
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions};
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
    memo: Arc<WriteMemo>,
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
            memo: Arc::new(WriteMemo::default()),
        }
    }

    /// The same executor writing through `client` (e.g. one impersonating another identity):
    /// same field manager, events, metrics and skip-unchanged memo, so an object keeps one
    /// owner in `managedFields` and one memo entry whichever identity writes it.
    pub fn with_client(&self, client: Client) -> Self {
        Self {
            client,
            field_manager: self.field_manager.clone(),
            recorder: self.recorder.clone(),
            metrics: self.metrics.clone(),
            memo: self.memo.clone(),
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

    /// Carries out `write`, then `events` only when the write was made: the events tell of the
    /// transition the write records, and a write skipped as already made (the memo: a
    /// reconcile that ran before the cache had its own write) was told of by the call that
    /// made it.
    pub async fn execute_with_events(
        &self,
        write: Op,
        events: Vec<Op>,
    ) -> Result<Outcome, ReconcileError> {
        let outcome = self.execute(write).await?;
        if outcome.wrote {
            self.execute_in_order(events).await?;
        }
        Ok(outcome)
    }

    /// Carries out one operation.
    pub async fn execute(&self, op: Op) -> Result<Outcome, ReconcileError> {
        let verb = op.verb();
        match op {
            Op::Apply(apply) => self.apply(verb, apply, false).await,
            Op::ApplyStatus(apply) => self.apply(verb, apply, true).await,
            Op::Create { key, body } => {
                let object: DynamicObject = serde_json::from_value(body)
                    .map_err(|e| ReconcileError::Config(format!("{key}: {e}")))?;
                match self.api(&key).create(&PostParams::default(), &object).await {
                    Ok(object) => {
                        self.metrics.object_write(verb, key.kind());
                        Ok(written(object))
                    }
                    // Already there: creating is all this operation promises.
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(Outcome::default()),
                    Err(e) => Err(failed("create", &key, e)),
                }
            }
            Op::MergePatch { key, patch } => {
                let result = self
                    .api(&key)
                    .patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                match result {
                    Ok(object) => {
                        self.metrics.object_write(verb, key.kind());
                        Ok(written(object))
                    }
                    // Gone: nothing left to patch.
                    Err(e) if is_not_found(&e) => Ok(Outcome::default()),
                    Err(e) => Err(failed("patch", &key, e)),
                }
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
        let version = object.resource_version();
        let outcome = written(object);
        if let Some(fp) = fingerprint {
            self.memo.record(key, fp, outcome.uid.clone(), version);
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
    Outcome {
        wrote: true,
        uid: object.uid(),
        object: Some(object),
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Secret;
    use kube::runtime::events::Reporter;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A canned apiserver: answers each request with the next (status, body) of `script`
    /// and reports the request lines it saw.
    async fn canned(
        script: Vec<(u16, &'static str)>,
    ) -> (Client, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (seen_tx, seen_rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            for (code, body) in script {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let mut buf = vec![0u8; 64 * 1024];
                let n = stream.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]);
                let _ = seen_tx.send(head.lines().next().unwrap_or_default().to_string());
                let response = format!(
                    "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            }
        });
        let config = kube::Config::new(format!("http://{addr}").parse().expect("url"));
        (Client::try_from(config).expect("client"), seen_rx)
    }

    fn executor(client: Client) -> Executor {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "test".into(),
                instance: None,
            },
        );
        Executor::new(client, "tender-test", recorder, Arc::new(Metrics::new()))
    }

    const SECRET: &str = r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"db","namespace":"c1","uid":"u1","resourceVersion":"5"}}"#;

    fn apply_db() -> Op {
        apply_db_over("4")
    }

    fn apply_db_over(live_version: &str) -> Op {
        Op::Apply(Apply {
            key: ObjectKey::of::<Secret>(Some("c1"), "db"),
            body: serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"}}),
            replace_if_immutable: false,
            fingerprint: Some(Fingerprint {
                live_version: Some(live_version.into()),
                desired: "h".into(),
            }),
        })
    }

    #[tokio::test]
    async fn an_apply_is_made_once_until_its_watch_event_arrives() {
        let (client, mut seen) = canned(vec![(200, SECRET), (200, SECRET)]).await;
        let exec = executor(client);
        let first = exec.execute(apply_db()).await.expect("apply");
        assert!(first.wrote);
        assert_eq!(first.uid.as_deref(), Some("u1"));
        let line = seen.recv().await.expect("a request");
        assert!(
            line.starts_with("PATCH /api/v1/namespaces/c1/secrets/db?"),
            "{line}"
        );
        assert!(
            line.contains("fieldManager=tender-test") && line.contains("force=true"),
            "{line}"
        );

        // Same content over the same cached version: skipped, uid from the memo, no request.
        let again = exec.execute(apply_db()).await.expect("skip");
        assert!(!again.wrote);
        assert_eq!(again.uid.as_deref(), Some("u1"));
        assert!(seen.try_recv().is_err(), "no second request");
        assert_eq!(exec.metrics.object_writes("apply", "Secret"), 1);

        // The watch event hands the decision to the cache: a decision on the version the
        // write produced is made; one still on the replaced version is stale and skipped.
        exec.memo()
            .forget(&ObjectKey::of::<Secret>(Some("c1"), "db"));
        assert!(!exec.execute(apply_db()).await.expect("stale").wrote);
        assert!(exec.execute(apply_db_over("5")).await.expect("apply").wrote);
    }

    #[tokio::test]
    async fn events_follow_a_write_only_when_it_is_made() {
        let event = r#"{"apiVersion":"events.k8s.io/v1","kind":"Event","metadata":{"name":"e1","namespace":"c1"},"eventTime":"2026-12-01T00:00:00.000000Z","reportingController":"test","reportingInstance":"test","action":"Deploy","reason":"Deployed","type":"Normal"}"#;
        let (client, mut seen) = canned(vec![(200, SECRET), (201, event), (201, event)]).await;
        let exec = executor(client);
        let deployed = || {
            vec![Op::Event(EventOp {
                regarding: k8s_openapi::api::core::v1::ObjectReference {
                    kind: Some("Secret".into()),
                    namespace: Some("c1".into()),
                    name: Some("db".into()),
                    ..Default::default()
                },
                type_: kube::runtime::events::EventType::Normal,
                reason: "Deployed".into(),
                action: "Deploy".into(),
                note: "applied".into(),
            })]
        };
        let first = exec
            .execute_with_events(apply_db(), deployed())
            .await
            .expect("write and event");
        assert!(first.wrote);
        assert!(seen.recv().await.expect("the write").starts_with("PATCH "));
        let line = seen.recv().await.expect("the event");
        assert!(
            line.starts_with("POST ") && line.contains("/events"),
            "{line}"
        );

        // The same write again over the same cached version: skipped, and so is its event
        // (the canned apiserver would answer one more event and report its request).
        let again = exec
            .execute_with_events(apply_db(), deployed())
            .await
            .expect("skip");
        assert!(!again.wrote);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(seen.try_recv().is_err(), "no event without its write");
    }

    #[tokio::test]
    async fn deleting_what_is_gone_or_replaced_is_not_an_error() {
        let not_found = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#;
        let conflict = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Conflict","code":409}"#;
        let (client, mut seen) = canned(vec![(404, not_found), (409, conflict)]).await;
        let exec = executor(client);
        let key = ObjectKey::of::<Secret>(Some("c1"), "db");
        let gone = exec
            .execute(Op::Delete {
                key: key.clone(),
                uid: None,
            })
            .await
            .expect("404 is done");
        assert!(!gone.wrote);
        // A uid precondition that fails means a newer object of that name: not ours.
        let newer = exec
            .execute(Op::Delete {
                key,
                uid: Some("old".into()),
            })
            .await
            .expect("409 on the uid precondition is done");
        assert!(!newer.wrote);
        assert!(seen.recv().await.expect("request").starts_with("DELETE "));
        assert_eq!(exec.metrics.object_writes("delete", "Secret"), 0);
    }

    #[tokio::test]
    async fn create_leaves_an_existing_object_alone() {
        let exists = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"AlreadyExists","code":409}"#;
        let namespace =
            r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"apps","uid":"n1"}}"#;
        let (client, mut seen) = canned(vec![(201, namespace), (409, exists)]).await;
        let exec = executor(client);
        let op = || Op::Create {
            key: ObjectKey::of::<k8s_openapi::api::core::v1::Namespace>(None, "apps"),
            body: serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "apps"}}),
        };
        let created = exec.execute(op()).await.expect("create");
        assert!(created.wrote);
        assert_eq!(created.uid.as_deref(), Some("n1"));
        assert!(
            seen.recv()
                .await
                .expect("request")
                .starts_with("POST /api/v1/namespaces")
        );
        let again = exec.execute(op()).await.expect("409 is done");
        assert!(!again.wrote);
        assert_eq!(exec.metrics.object_writes("create", "Namespace"), 1);
    }

    #[tokio::test]
    async fn errors_about_secrets_do_not_quote_the_apiserver() {
        let invalid = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Invalid","code":422,"message":"data[password]: Invalid value: \"hunter2\""}"#;
        let (client, _seen) = canned(vec![(422, invalid)]).await;
        let exec = executor(client);
        let error = exec.execute(apply_db()).await.expect_err("422");
        assert_eq!(error.reason(), "Invalid");
        assert!(!error.to_string().contains("hunter2"), "{error}");
        assert!(!format!("{error:?}").contains("hunter2"), "{error:?}");
        assert!(exec.memo().is_empty(), "a failed write is not remembered");
    }

    #[tokio::test]
    async fn another_client_shares_the_memo_and_field_manager() {
        let (client, _) = canned(vec![]).await;
        let exec = executor(client.clone());
        let other = exec.with_client(client);
        let key = ObjectKey::of::<Secret>(Some("apps"), "db");
        let fp = Fingerprint {
            live_version: Some("7".into()),
            desired: "h".into(),
        };
        other
            .memo()
            .record(key.clone(), fp.clone(), Some("uid-1".into()), None);
        assert_eq!(exec.memo().written(&key, &fp), Some(Some("uid-1".into())));
        exec.memo().forget(&key);
        assert!(other.memo().is_empty());
        assert_eq!(other.field_manager, exec.field_manager);
    }
}
