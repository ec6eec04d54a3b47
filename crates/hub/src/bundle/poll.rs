//! The Bundle's side of `pollingInterval`: the repository credentials it may use, the look
//! ([`crate::helm_poll`]), and the spec its BundleDeployments are planned from — the chart at
//! the version the hub resolved (decision 0104-hub-polls-chart-versions).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;
use tender_types::{Bundle, BundleSpec, SourceKind};

use super::plan::{SourceKey, SourceState};
use crate::context::Ctx;
use crate::helm_poll::{self, Credentials, PollReport};

/// The Bundle's poll report and when to look again; `None` when it does not poll.
///
/// Credentials come from `helm.helmSecretName` only when that Secret is one of the Bundle's
/// own copy sources and a source the hub may copy (never a Cluster's kubeconfig or a token):
/// the hub sends to the repository nothing the Bundle does not already send downstream.
pub(super) async fn look(
    ctx: &Ctx,
    bundle: &Bundle,
    sources: &BTreeMap<SourceKey, SourceState>,
) -> Option<(PollReport, Duration)> {
    let (interval, helm) = helm_poll::polling(&bundle.spec)?;
    let ns = bundle.namespace().unwrap_or_default();
    let credentials = match helm.helm_secret_name.as_deref() {
        Some(name) if copied(sources, name) => read_credentials(ctx, &ns, name).await,
        _ => None,
    };
    let found = ctx.poller.versions(&ns, helm, credentials, interval).await;
    let recorded = bundle.status.as_ref().and_then(|s| s.version.as_deref());
    let report = helm_poll::report(helm, &found, recorded);
    if !report.ok {
        tracing::debug!(bundle = %bundle.name_any(), namespace = %ns, reason = report.reason, "chart version poll failed");
    }
    Some((report, helm_poll::jittered(interval)))
}

/// Whether Secret `name` is a copy source of the Bundle that the hub may copy.
fn copied(sources: &BTreeMap<SourceKey, SourceState>, name: &str) -> bool {
    sources.iter().any(|((kind, source), state)| {
        kind.source_kind() == Some(SourceKind::Secret)
            && source == name
            && matches!(state, SourceState::Found { .. })
    })
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

/// The spec BundleDeployments are planned from: the chart at the resolved exact version
/// when there is one, else the Bundle's own spec.
pub(super) fn resolved_spec<'a>(
    spec: &'a BundleSpec,
    report: Option<&PollReport>,
) -> Cow<'a, BundleSpec> {
    match (report.and_then(|r| r.version.as_deref()), &spec.helm) {
        (Some(version), Some(_)) => {
            let mut s = spec.clone();
            if let Some(h) = s.helm.as_mut() {
                h.version = Some(version.to_string());
            }
            Cow::Owned(s)
        }
        _ => Cow::Borrowed(spec),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn deployments_get_the_resolved_version() {
        let spec: BundleSpec = serde_json::from_value(json!({
            "helm": {"chart": "app", "repo": "https://c", "version": "^0.1"},
            "pollingInterval": "30s"
        }))
        .unwrap();
        let report = PollReport {
            version: Some("0.1.4".into()),
            ..PollReport::default()
        };
        let s = resolved_spec(&spec, Some(&report));
        assert_eq!(s.helm.as_ref().unwrap().version.as_deref(), Some("0.1.4"));
        assert!(matches!(resolved_spec(&spec, None), Cow::Borrowed(_)));
        let none = PollReport::default();
        assert_eq!(
            resolved_spec(&spec, Some(&none))
                .helm
                .as_ref()
                .unwrap()
                .version
                .as_deref(),
            Some("^0.1"),
            "nothing resolved yet: the agents resolve the range"
        );
    }
}
