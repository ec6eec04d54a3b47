//! Chart polling as a controller of its own (decision 0113-chart-polling-controller): keyed by
//! Bundle, it looks at the chart repository of every Bundle with `pollingInterval` on that
//! interval ([`crate::helm_poll`]) and records what it found in the Bundle's status —
//! `status.version` and the `Polled` condition — with its own field manager. The Bundle
//! reconcile only reads what was recorded: no network call is made inside it.
//!
//! Observe (the Bundle, its credentials when they are one of its copy sources) → look → the
//! status fields ([`desired`], pure) → one status apply when they differ from the recorded ones.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use tender_runtime::executor::{Apply, Fingerprint, ObjectKey, Op};
use tender_runtime::{Executor, retry};
use tender_types::conditions::{TYPE_POLLED, TYPE_POLLING_INTERVAL};
use tender_types::{Bundle, BundleStatus, SourceKind, hash, labels};

use crate::Error;
use crate::context::Ctx;
use crate::helm_poll::{self, Credentials, PollReport, Resolution};

const CONTROLLER: &str = "poll";

/// Field manager of the poller's status fields: the Bundle controller's status apply leaves
/// them out, so server-side apply keeps them as the poller wrote them.
pub(crate) fn field_manager() -> String {
    format!("{}-poll", labels::HUB_FIELD_MANAGER)
}

/// What the poll controller shares: the scope's context and its own status writer.
pub(crate) struct PollCtx {
    /// The scope's context (caches, poller, metrics).
    pub ctx: Arc<Ctx>,
    /// Writes `status.version` and `Polled` with [`field_manager`].
    pub exec: Executor,
}

/// Looks for `bundle` when it polls, records the outcome, and comes back on its interval.
pub(crate) async fn reconcile(bundle: Arc<Bundle>, pc: Arc<PollCtx>) -> Result<Action, Error> {
    let ctx = &pc.ctx;
    let _timer = ctx.metrics.reconcile(CONTROLLER);
    if bundle.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let resolution = helm_poll::resolution(&bundle);
    let report = match resolution {
        Some(Resolution::Every(interval, helm)) => Some(look(ctx, &bundle, interval, helm).await),
        // Resolved for this spec already: nothing to look at until the spec changes.
        Some(Resolution::Once(_)) if resolved_for_this_spec(&bundle) => {
            return Ok(Action::await_change());
        }
        Some(Resolution::Once(helm)) => Some(look(ctx, &bundle, ONCE_RETRY, helm).await),
        None => None,
    };
    // Decide on the cache as it is now: the trigger's snapshot may predate our last write.
    let latest = ctx
        .stores
        .bundles
        .get(&ObjectRef::from_obj(bundle.as_ref()));
    let bundle: &Bundle = latest.as_deref().unwrap_or(&bundle);
    let old = recorded(bundle.status.as_ref());
    let new = desired(
        bundle.status.as_ref(),
        report.as_ref(),
        helm_poll::raised(&bundle.spec),
        bundle.metadata.generation,
        Time(ctx.clock.now()),
    );
    if old != new {
        write(&pc.exec, ctx, bundle, &new).await?;
    }
    Ok(match resolution {
        Some(Resolution::Every(interval, _)) => Action::requeue(helm_poll::jittered(interval)),
        // A failed look is tried again; a found version stands until the spec changes.
        Some(Resolution::Once(_)) if new.polled.as_ref().is_none_or(|c| c.status != "True") => {
            Action::requeue(helm_poll::jittered(ONCE_RETRY))
        }
        _ => Action::await_change(),
    })
}

/// How soon a failed look of a once-per-spec resolution is tried again (and how fresh a
/// shared look must be to answer it).
const ONCE_RETRY: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether the poller found a version for the Bundle's current generation.
fn resolved_for_this_spec(bundle: &Bundle) -> bool {
    bundle.status.as_ref().is_some_and(|s| {
        s.conditions.iter().any(|c| {
            c.type_ == TYPE_POLLED
                && c.status == "True"
                && c.observed_generation == bundle.metadata.generation
        })
    })
}

pub(crate) fn error_policy(bundle: Arc<Bundle>, error: &Error, pc: Arc<PollCtx>) -> Action {
    retry::error_policy(
        CONTROLLER,
        bundle.as_ref(),
        error,
        &pc.ctx.retries,
        &pc.ctx.metrics,
    )
}

/// The fields the poller owns: `status.version`, the `Polled` condition and the
/// `PollingInterval` condition (only while the interval is raised to the hub's floor).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Recorded {
    pub version: Option<String>,
    pub polled: Option<Condition>,
    pub raised: Option<Condition>,
}

/// What `status` holds of the poller's fields.
pub(crate) fn recorded(status: Option<&BundleStatus>) -> Recorded {
    Recorded {
        version: status.and_then(|s| s.version.clone()),
        polled: status.and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == TYPE_POLLED)
                .cloned()
        }),
        raised: status.and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == TYPE_POLLING_INTERVAL)
                .cloned()
        }),
    }
}

/// The poller's fields after `report` (none without polling) and with the interval `raised`
/// to the hub's floor, if it is. Pure.
pub(crate) fn desired(
    status: Option<&BundleStatus>,
    report: Option<&PollReport>,
    raised: Option<(&str, std::time::Duration)>,
    generation: Option<i64>,
    now: Time,
) -> Recorded {
    let mut s = status.cloned().unwrap_or_default();
    helm_poll::set_status(&mut s, report, generation, now.clone());
    helm_poll::set_raised(&mut s, raised, generation, now);
    recorded(Some(&s))
}

/// One look at the Bundle's chart repository; a failure is a report too.
///
/// Credentials come from `helm.helmSecretName` only when that Secret is one of the Bundle's
/// own copy sources and a source the hub may copy (never a Cluster's kubeconfig or a token):
/// the hub sends to the repository nothing the Bundle does not already send downstream.
async fn look(
    ctx: &Ctx,
    bundle: &Bundle,
    interval: std::time::Duration,
    helm: &tender_types::HelmOptions,
) -> PollReport {
    let ns = bundle.namespace().unwrap_or_default();
    let credentials = match helm.helm_secret_name.as_deref() {
        Some(name) if copied(ctx, bundle, name).await => read_credentials(ctx, &ns, name).await,
        _ => None,
    };
    let found = ctx.poller.versions(&ns, helm, credentials, interval).await;
    let recorded = bundle.status.as_ref().and_then(|s| s.version.as_deref());
    let report = helm_poll::report(helm, &found, recorded);
    if !report.ok {
        tracing::debug!(bundle = %bundle.name_any(), namespace = %ns, reason = report.reason, "chart version poll failed");
    }
    report
}

/// Whether Secret `name` is a copy source of the Bundle that the hub may copy (copying on,
/// the Bundle names it, and it is found and not refused).
async fn copied(ctx: &Ctx, bundle: &Bundle, name: &str) -> bool {
    use crate::bundle::plan::{SourceState, referenced_sources};
    if !ctx.config.copy_resources_downstream {
        return false;
    }
    let ns = bundle.namespace().unwrap_or_default();
    let Some(key) = referenced_sources(&bundle.spec)
        .into_iter()
        .find(|(kind, source)| kind.source_kind() == Some(SourceKind::Secret) && source == name)
    else {
        return false;
    };
    let mut fetched = std::collections::HashMap::new();
    matches!(
        crate::bundle::source_state(ctx, &ns, &key, &mut fetched).await,
        Ok(SourceState::Found { .. })
    )
}

async fn read_credentials(ctx: &Ctx, ns: &str, name: &str) -> Option<Credentials> {
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), ns)
        .get_opt(name)
        .await
        .ok()
        .flatten()?;
    let data = secret.data.unwrap_or_default();
    let text = |k: &str| {
        data.get(k)
            .map(|b| String::from_utf8_lossy(&b.0).trim().to_string())
    };
    Some(Credentials {
        username: text("username")?,
        password: text("password")?,
    })
}

/// Applies the poller's fields (and only them); a field left out is removed from what this
/// manager owns, so a Bundle that stops polling loses both.
async fn write(exec: &Executor, ctx: &Ctx, bundle: &Bundle, new: &Recorded) -> Result<(), Error> {
    // Written a moment ago and the cache has not caught up: the executor's memo skips it.
    ctx.write_status_with(exec, status_op(bundle, new)).await
}

/// The status apply of the poller's fields. Pure.
fn status_op(bundle: &Bundle, new: &Recorded) -> Op {
    let mut status = serde_json::Map::new();
    if let Some(v) = &new.version {
        status.insert("version".into(), serde_json::json!(v));
    }
    let conditions: Vec<&Condition> = new.polled.iter().chain(&new.raised).collect();
    if !conditions.is_empty() {
        status.insert("conditions".into(), serde_json::json!(conditions));
    }
    let body = serde_json::json!({
        "apiVersion": tender_types::API_GROUP_VERSION,
        "kind": "Bundle",
        "status": status,
    });
    Op::ApplyStatus(Apply {
        key: ObjectKey::of::<Bundle>(
            Some(&bundle.namespace().unwrap_or_default()),
            &bundle.name_any(),
        ),
        fingerprint: Some(Fingerprint {
            live_version: bundle.resource_version(),
            desired: hash::value_hash(&body),
        }),
        body,
        replace_if_immutable: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    fn report(version: &str) -> PollReport {
        PollReport {
            version: Some(version.into()),
            ok: true,
            reason: tender_types::conditions::reason::VERSION_RESOLVED,
            message: format!("found {version}"),
        }
    }

    fn bundle(status: Option<BundleStatus>) -> Bundle {
        let mut b: Bundle = serde_json::from_value(json!({
            "apiVersion": "tender.dev/v1alpha1", "kind": "Bundle",
            "metadata": {"name": "app", "namespace": "ws", "resourceVersion": "7", "generation": 2},
            "spec": {}
        }))
        .unwrap();
        b.status = status;
        b
    }

    #[test]
    fn a_new_version_is_recorded_and_an_unchanged_one_is_not() {
        let first = desired(None, Some(&report("0.1.0")), None, Some(2), at(10));
        assert_eq!(first.version.as_deref(), Some("0.1.0"));
        let status = BundleStatus {
            version: first.version.clone(),
            conditions: first.polled.clone().into_iter().collect(),
            ..BundleStatus::default()
        };
        assert_eq!(
            desired(Some(&status), Some(&report("0.1.0")), None, Some(2), at(20)),
            recorded(Some(&status)),
            "nothing new: nothing to write"
        );
        let next = desired(Some(&status), Some(&report("0.1.1")), None, Some(2), at(30));
        assert_eq!(next.version.as_deref(), Some("0.1.1"));
        assert_eq!(next.polled.unwrap().last_transition_time, at(30));
    }

    #[test]
    fn a_bundle_that_stops_polling_loses_both_fields() {
        let status = BundleStatus {
            version: Some("0.1.0".into()),
            conditions: desired(None, Some(&report("0.1.0")), None, Some(1), at(1))
                .polled
                .into_iter()
                .collect(),
            ..BundleStatus::default()
        };
        let none = desired(Some(&status), None, None, Some(2), at(2));
        assert_eq!(none, Recorded::default());
        let Op::ApplyStatus(apply) = status_op(&bundle(Some(status)), &none) else {
            panic!("a status apply");
        };
        assert_eq!(
            apply.body["status"],
            json!({}),
            "only the poller's fields, none"
        );
    }

    #[test]
    fn the_apply_holds_only_the_pollers_fields() {
        let new = desired(None, Some(&report("0.2.0")), None, Some(2), at(5));
        let Op::ApplyStatus(apply) = status_op(&bundle(None), &new) else {
            panic!("a status apply");
        };
        let status = apply.body["status"].as_object().unwrap();
        assert_eq!(status.len(), 2);
        assert_eq!(status["version"], json!("0.2.0"));
        assert_eq!(status["conditions"][0]["type"], json!(TYPE_POLLED));
        assert_eq!(status["conditions"][0]["observedGeneration"], json!(2));
    }
}
