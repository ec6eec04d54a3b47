//! Issue 24 item 6, Fleet's TLS options for chart repositories (decision
//! 0106-chart-repository-tls): a chart repository over HTTPS on loopback whose certificate
//! comes from a private CA. Without the CA the fetch fails (ChartRepositoryUnreachable, an
//! unknown issuer) and nothing is deployed; with `cacerts` in the helmSecretName Secret it
//! deploys; bad `cacerts` is its own reason and keeps what is deployed; a HelmOp with
//! `insecureSkipTLSVerify: true` (no CA) deploys and its BundleDeployment shows
//! `TLSVerified=False` beside `Ready=True`.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use tender_e2e::charts::ChartRepo;
use tender_e2e::fixture::{Workspace, stays};
use tender_e2e::pki::Ca;
use tender_e2e::{downstream_name, eventually, shared_env, unique_name};
use tender_types::conditions::{
    TYPE_DEPLOYED, TYPE_READY, TYPE_TLS_VERIFIED, find_condition, is_true, reason,
};
use tender_types::{BundleDeployment, HelmOp};

const WAIT: Duration = tender_e2e::fixture::WAIT;
const USER: &str = "chart-reader";
const PASSWORD: &str = "tls-repo-pass-123";

/// Bundle `app` of chart `app` 0.1.0 from `repo`, authenticating with Secret `secret` (copied).
fn bundle(cluster: &str, ns: &str, repo: &str, secret: &str) -> Value {
    json!({
        "targets": [{"clusterName": cluster}],
        "defaultNamespace": ns,
        "downstreamResources": [{"kind": "Secret", "name": secret}],
        "helm": {
            "chart": "app", "repo": repo, "version": "0.1.0", "releaseName": "web",
            "values": {"greeting": "hi"}, "helmSecretName": secret,
        },
    })
}

async fn greeting(api: &Api<ConfigMap>, name: &str) -> Option<String> {
    api.get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|c| c.data.and_then(|d| d.get("greeting").cloned()))
}

/// Waits for the `Deployed` condition of `bundle` with reason `want`; returns its message.
async fn deployed_reason(ws: &Workspace, cluster: &str, bundle: &str, want: &str) -> String {
    let api = ws.bds(cluster);
    eventually(&format!("Deployed reason {want}"), WAIT, || async {
        let bd = api.get_opt(bundle).await?;
        Ok::<_, kube::Error>(bd.and_then(|bd| {
            let s = bd.status?;
            find_condition(&s.conditions, TYPE_DEPLOYED)
                .filter(|c| c.reason == want)
                .map(|c| c.message.clone())
        }))
    })
    .await
}

fn tls_verified(bd: &BundleDeployment) -> Option<(String, String)> {
    let s = bd.status.as_ref()?;
    find_condition(&s.conditions, TYPE_TLS_VERIFIED).map(|c| (c.status.clone(), c.reason.clone()))
}

#[tokio::test]
async fn a_private_ca_from_cacerts_or_insecure_skip_tls_verify_reaches_an_https_repository() {
    let ca = Ca::new().unwrap();
    let (cert, key) = ca.serving_cert_pem("tender-e2e-charts").unwrap();
    let repo = ChartRepo::start_tls(&["0.1.0"], USER, PASSWORD, &cert, &key)
        .await
        .expect("starting the HTTPS chart repository");
    assert!(repo.url.starts_with("https://127.0.0.1:"));
    let ws = Workspace::new(shared_env(1).await, "charttls").await;
    let agent = ws.helm_agent("west", &downstream_name(1)).await;
    let down = ws.downstream(&agent.downstream).await;
    let ns = unique_name("chart-tls");
    let cms: Api<ConfigMap> = Api::namespaced(down.clone(), &ns);
    let ca_pem = ca.cert_pem();
    ws.source_secret("repo-auth", &[("username", USER), ("password", PASSWORD)])
        .await;
    ws.source_secret(
        "repo-ca",
        &[
            ("username", USER),
            ("password", PASSWORD),
            ("cacerts", &ca_pem),
        ],
    )
    .await;
    ws.source_secret(
        "repo-bad-ca",
        &[
            ("username", USER),
            ("password", PASSWORD),
            (
                "cacerts",
                "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
            ),
        ],
    )
    .await;

    // (a) The system roots do not know the private CA: an unknown issuer, nothing deployed.
    ws.bundle("app", bundle("west", &ns, &repo.url, "repo-auth"))
        .await;
    let msg = deployed_reason(&ws, "west", "app", reason::CHART_REPOSITORY_UNREACHABLE).await;
    assert!(
        msg.contains("certificate") || msg.contains("UnknownIssuer"),
        "a TLS failure: {msg}"
    );
    assert!(!msg.contains(PASSWORD));
    assert_eq!(repo.refused(), 0, "no request got through the handshake");
    assert_eq!(greeting(&cms, "web-config").await, None);

    // (b) With the CA in cacerts of the helmSecretName Secret it deploys, verified.
    ws.bundle("app", bundle("west", &ns, &repo.url, "repo-ca"))
        .await;
    let bd = ws.ready("west", "app").await;
    assert_eq!(greeting(&cms, "web-config").await.as_deref(), Some("hi"));
    assert_eq!(tls_verified(&bd), None, "verified TLS adds no condition");

    // Bad cacerts is its own reason, and what is deployed stays.
    ws.bundle("app", bundle("west", &ns, &repo.url, "repo-bad-ca"))
        .await;
    let msg = deployed_reason(&ws, "west", "app", reason::CHART_REPOSITORY_CA_INVALID).await;
    assert!(msg.contains("cacerts"), "{msg}");
    stays(
        "bad cacerts: the deployed chart objects",
        Duration::from_secs(3),
        &Some("hi".to_string()),
        || greeting(&cms, "web-config"),
    )
    .await;

    // (c) A HelmOp with insecureSkipTLSVerify and no CA deploys; its BundleDeployment says
    // TLS is not verified, beside Ready=True.
    let helmops: Api<HelmOp> = Api::namespaced(ws.hub.clone(), &ws.ns);
    let body = json!({
        "apiVersion": "tender.dev/v1alpha1", "kind": "HelmOp",
        "metadata": {"name": "insecure"},
        "spec": {
            "helm": {
                "chart": "app", "repo": repo.url, "version": "0.1.0",
                "releaseName": "web2", "values": {"greeting": "unverified"},
            },
            "helmSecretName": "repo-auth",
            "insecureSkipTLSVerify": true,
            "namespace": ns,
            "targets": [{"clusterName": "west"}],
        }
    });
    helmops
        .patch("insecure", &PatchParams::apply("e2e"), &Patch::Apply(&body))
        .await
        .expect("insecureSkipTLSVerify: true is accepted");
    let bd = ws.ready("west", "insecure").await;
    assert_eq!(
        greeting(&cms, "web2-config").await.as_deref(),
        Some("unverified")
    );
    assert_eq!(
        tls_verified(&bd),
        Some(("False".into(), reason::INSECURE_SKIP_TLS_VERIFY.into()))
    );
    assert!(is_true(&bd.status.unwrap().conditions, TYPE_READY));
    eventually(
        "the HelmOp's Bundle carries insecureSkipTLSVerify",
        WAIT,
        || async {
            let b = ws.bds("west").get("insecure").await?;
            Ok::<_, kube::Error>(
                b.spec
                    .helm
                    .as_ref()
                    .is_some_and(|h| h.insecure_skip_tls_verify)
                    .then_some(()),
            )
        },
    )
    .await;
    drop(agent);
}
