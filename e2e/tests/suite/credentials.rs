//! Agent credentials that expire (issue 14, decision 0044-expiring-agent-credentials), on a real
//! hub and downstream cluster: the registration token is a bound ServiceAccount token with an
//! expiry; the agent renews its own before it runs out (proved with a 600 s token and a 597 s
//! margin, so it renews every ~3 s), switches its hub client to the new token (the registration
//! token is then revoked and the client keeps working) and stores it downstream; it may mint
//! tokens of its own ServiceAccount only; deleting the Cluster makes every token of the agent fail
//! at once.

use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tender_agent::credentials::{self, Persist, Renewal};
use tender_e2e::fixture::{WAIT, Workspace};
use tender_e2e::{HUB, TestEnv, downstream_name, eventually, kubeconfig_yaml, shared_env};
use tender_runtime::token::{BearerToken, client_with_token, expiry};
use tender_types::{BundleDeployment, Cluster, names};

/// The agent's hub kubeconfig holding `token`, as `tender cluster add` prints it.
fn agent_kubeconfig(env: &TestEnv, token: &str) -> Kubeconfig {
    let yaml = kubeconfig_yaml(
        HUB,
        &env.cluster(HUB).server,
        env.ca_pem(),
        "tender-agent",
        token,
    );
    Kubeconfig::from_yaml(&yaml).unwrap()
}

async fn client_with(env: &TestEnv, token: &BearerToken) -> kube::Client {
    let config = kube::Config::from_custom_kubeconfig(
        agent_kubeconfig(env, &token.get()),
        &KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    client_with_token(config, None, "tender-agent-e2e", token.clone()).unwrap()
}

/// A token of the agent of `ns` for `lifetime`, bound to Secret `bound_to` when given (it
/// stops authenticating when that Secret is deleted).
async fn registration_token(
    hub: &kube::Client,
    ns: &str,
    lifetime: i64,
    bound_to: Option<&Secret>,
) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(hub.clone(), ns);
    eventually("the agent ServiceAccount", WAIT, || async {
        Ok::<_, kube::Error>(
            accounts
                .get_opt(names::AGENT_SERVICE_ACCOUNT)
                .await?
                .map(|_| ()),
        )
    })
    .await;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(lifetime),
            bound_object_ref: bound_to.map(|s| BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Secret".into()),
                name: s.metadata.name.clone(),
                uid: s.metadata.uid.clone(),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let issued = accounts
        .create_token_request(
            names::AGENT_SERVICE_ACCOUNT,
            &PostParams::default(),
            &request,
        )
        .await
        .unwrap();
    issued.status.and_then(|s| s.token).unwrap()
}

/// What a request of `client` to its cluster namespace answers: `Ok` or the HTTP code.
async fn list_status(client: &kube::Client, ns: &str) -> Result<(), u16> {
    let bds: Api<BundleDeployment> = Api::namespaced(client.clone(), ns);
    match bds.list(&ListParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) => Err(s.code),
        Err(other) => panic!("unexpected error: {other}"),
    }
}

#[tokio::test]
async fn the_agent_renews_its_expiring_token_and_switches_to_it() {
    let env = shared_env(1).await;
    let ws = Workspace::new(env, "cred-renew").await;
    ws.cluster("east").await;
    let ns = ws.cluster_ns("east");

    // A registration token that lives 600 s (the apiserver's minimum) and dies with a Secret.
    let secrets: Api<Secret> = Api::namespaced(ws.hub.clone(), &ns);
    let ticket = secrets
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("registration-ticket".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let registration = registration_token(&ws.hub, &ns, 600, Some(&ticket)).await;
    let exp = expiry(&registration).expect("a bound token has an expiry");
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    assert!(
        (590..=610).contains(&(exp - now)),
        "expires in {}s",
        exp - now
    );

    // The downstream Secret the agent was installed from, as the CLI's manifests create it.
    let down = ws.downstream(&downstream_name(1)).await;
    let agent_ns = tender_e2e::unique_name("cred-agent");
    tender_e2e::fixture::create_namespace(&down, &agent_ns).await;
    let kubeconfig = agent_kubeconfig(env, &registration);
    let stored: Api<Secret> = Api::namespaced(down.clone(), &agent_ns);
    stored
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("tender-agent-hub".into()),
                    ..Default::default()
                },
                data: Some(
                    [(
                        "kubeconfig".to_string(),
                        ByteString(
                            credentials::with_token(&kubeconfig, &registration)
                                .unwrap()
                                .into_bytes(),
                        ),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
        )
        .await
        .unwrap();

    // The agent's client and its renewal: 600 s tokens, renewed 597 s before expiry.
    let token = BearerToken::new(registration.clone());
    let hub = client_with(env, &token).await;
    assert_eq!(list_status(&hub, &ns).await, Ok(()));
    let persist = Persist {
        downstream: down.clone(),
        namespace: agent_ns.clone(),
        name: "tender-agent-hub".into(),
        kubeconfig,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let renewal = tokio::spawn(credentials::keep_fresh(
        hub.clone(),
        token.clone(),
        ns.clone(),
        Renewal {
            lifetime: Duration::from_secs(600),
            margin: Duration::from_secs(597),
        },
        Some(persist.clone()),
        async move {
            let _ = stopped.await;
        },
    ));

    // It asked for a new token and switched to it…
    let renewed = eventually(
        "the agent renewed its token",
        Duration::from_secs(30),
        || async {
            let t = token.get();
            Ok::<_, kube::Error>((t != registration).then_some(t))
        },
    )
    .await;
    assert!(
        expiry(&renewed).unwrap() >= exp,
        "a renewed token lives at least as long"
    );
    // …and keeps renewing (every ~3 s) without a restart.
    eventually("a second renewal", Duration::from_secs(30), || async {
        let t = token.get();
        Ok::<_, kube::Error>((t != renewed && t != registration).then_some(()))
    })
    .await;
    // The renewed kubeconfig is stored downstream, so a restart starts from a live token.
    eventually(
        "the renewed token stored downstream",
        Duration::from_secs(30),
        || async {
            let stored = credentials::stored_token(&persist).await;
            Ok::<_, kube::Error>(stored.filter(|s| *s != registration).map(|_| ()))
        },
    )
    .await;
    assert_eq!(
        credentials::fresher(
            registration.clone(),
            credentials::stored_token(&persist).await
        ),
        credentials::stored_token(&persist).await.unwrap(),
        "at start-up the stored, later-expiring token wins over the mounted one"
    );

    // Revoke the registration token: a client on it is refused, the agent's client is not.
    secrets
        .delete("registration-ticket", &DeleteParams::default())
        .await
        .unwrap();
    let old = client_with(env, &BearerToken::new(registration.clone())).await;
    eventually("the registration token is refused", WAIT, || async {
        Ok::<_, kube::Error>((list_status(&old, &ns).await == Err(401)).then_some(()))
    })
    .await;
    assert_eq!(
        list_status(&hub, &ns).await,
        Ok(()),
        "the agent switched to its own token"
    );

    // The agent may mint tokens of its own ServiceAccount only.
    let accounts: Api<ServiceAccount> = Api::namespaced(hub.clone(), &ns);
    let other = accounts
        .create_token_request("default", &PostParams::default(), &TokenRequest::default())
        .await;
    assert!(
        matches!(&other, Err(kube::Error::Api(s)) if s.code == 403),
        "minting another ServiceAccount's token must be refused: {other:?}"
    );

    let _ = stop.send(());
    renewal.await.unwrap();
}

#[tokio::test]
async fn deleting_the_cluster_revokes_its_agent_at_once() {
    let env = shared_env(1).await;
    let ws = Workspace::new(env, "cred-revoke").await;
    ws.cluster("west").await;
    let ns = ws.cluster_ns("west");
    let token = BearerToken::new(registration_token(&ws.hub, &ns, 3600, None).await);
    let hub = client_with(env, &token).await;
    assert_eq!(list_status(&hub, &ns).await, Ok(()));
    // A token the agent renewed itself is revoked the same way.
    let renewed = credentials::request_token(&hub, &ns, Duration::from_secs(3600))
        .await
        .unwrap();
    token.set(renewed);
    assert_eq!(list_status(&hub, &ns).await, Ok(()));

    let clusters: Api<Cluster> = Api::namespaced(ws.hub.clone(), &ws.ns);
    clusters
        .delete("west", &DeleteParams::default())
        .await
        .unwrap();
    // The namespace (and with it the ServiceAccount) goes: the next requests are refused.
    let code = eventually("the agent's token is refused", WAIT, || async {
        Ok::<_, kube::Error>(list_status(&hub, &ns).await.err())
    })
    .await;
    assert!(matches!(code, 401 | 403), "refused with {code}");
    let mint = credentials::request_token(&hub, &ns, Duration::from_secs(3600)).await;
    assert!(mint.is_err(), "a revoked agent cannot renew itself");
}

/// The real `tender-agent` binary, started with a 600 s registration token (the apiserver's
/// minimum) and `--hub-token-refresh-margin-seconds 597`: it renews within seconds, again and
/// again, stores each renewed kubeconfig in its downstream Secret, logs the renewal without the
/// token, and still applies a rotation after the registration token is revoked.
#[tokio::test]
async fn the_agent_binary_renews_its_token_early_and_keeps_applying_after_revocation() {
    let env = shared_env(1).await;
    let bins = tokio::task::spawn_blocking(tender_e2e::binaries::tender_binaries)
        .await
        .unwrap()
        .expect("building the binaries");
    let ws = Workspace::new(env, "cred-binary").await;
    ws.cluster("east").await;
    let ns = ws.cluster_ns("east");
    let secrets: Api<Secret> = Api::namespaced(ws.hub.clone(), &ns);
    let ticket = secrets
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("registration-ticket".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let registration = registration_token(&ws.hub, &ns, 600, Some(&ticket)).await;
    let exp = expiry(&registration).unwrap();

    // Installed as the CLI's manifests install it: the hub kubeconfig mounted as a file and
    // stored in the downstream Secret `tender-agent-hub`.
    let down = ws.downstream(&downstream_name(1)).await;
    let agent_ns = tender_e2e::unique_name("cred-binary-agent");
    tender_e2e::fixture::create_namespace(&down, &agent_ns).await;
    let kubeconfig = agent_kubeconfig(env, &registration);
    let text = credentials::with_token(&kubeconfig, &registration).unwrap();
    let stored: Api<Secret> = Api::namespaced(down.clone(), &agent_ns);
    stored
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("tender-agent-hub".into()),
                    ..Default::default()
                },
                data: Some(
                    [(
                        "kubeconfig".to_string(),
                        ByteString(text.clone().into_bytes()),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let dir = env.state_dir().join(tender_e2e::unique_name("cred-binary"));
    std::fs::create_dir_all(&dir).unwrap();
    let hub_file = dir.join("hub.kubeconfig");
    let down_file = dir.join("downstream.kubeconfig");
    std::fs::write(&hub_file, &text).unwrap();
    std::fs::write(
        &down_file,
        env.kubeconfig_as(&downstream_name(1), tender_e2e::ADMIN_USER),
    )
    .unwrap();
    let log = dir.join("agent.log");
    let arg = |s: &str| s.to_string();
    let args = vec![
        arg("--hub-kubeconfig"),
        hub_file.display().to_string(),
        arg("--kubeconfig"),
        down_file.display().to_string(),
        arg("--workspace-namespace"),
        ws.ns.clone(),
        arg("--cluster-name"),
        arg("east"),
        arg("--heartbeat-seconds"),
        arg("2"),
        arg("--metrics-addr"),
        arg("127.0.0.1:0"),
        arg("--hub-token-lifetime-seconds"),
        arg("600"),
        arg("--hub-token-refresh-margin-seconds"),
        arg("597"),
        arg("--hub-kubeconfig-secret"),
        arg("tender-agent-hub"),
    ];
    // The hub's public keys, as `tender cluster add` registers them: the agent deploys only
    // copies the hub signed (decision 0089-signed-copies).
    let hub_keys = tender_e2e::hub_harness::hub_signing_keys(&ws.hub, &ws.ns).await;
    let vars = [
        ("POD_NAMESPACE", agent_ns.as_str()),
        ("POD_NAME", "tender-agent-e2e"),
        ("EXPERIMENTAL_COPY_RESOURCES_DOWNSTREAM", "true"),
        ("TENDER_HUB_SIGNING_KEYS", hub_keys.as_str()),
        ("RUST_LOG", "info"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()));
    let mut agent =
        tender_e2e::Process::start_with_env("tender-agent", &bins.agent, &args, &vars, &log)
            .unwrap();

    // It works: a copy and a manifest arrive.
    let target = tender_e2e::unique_name("cred-binary-app");
    ws.source_secret("db-creds", &[("password", "v1")]).await;
    ws.source_config_map("app-config", &[("mode", "fast")])
        .await;
    ws.bundle("app", tender_e2e::fixture::app_bundle(&["east"], &target))
        .await;
    ws.ready("east", "app").await;

    // The stored kubeconfig switches to a renewed token, then to another: renewals, early.
    let persist = Persist {
        downstream: down.clone(),
        namespace: agent_ns.clone(),
        name: "tender-agent-hub".into(),
        kubeconfig,
    };
    let first = eventually(
        "the binary stored a renewed token",
        Duration::from_secs(30),
        || async {
            let t = credentials::stored_token(&persist).await;
            Ok::<_, kube::Error>(t.filter(|t| *t != registration))
        },
    )
    .await;
    assert!(
        expiry(&first).unwrap() >= exp,
        "a renewed token lives at least as long"
    );
    let second = eventually(
        "the binary stored a second renewal",
        Duration::from_secs(30),
        || async {
            let t = credentials::stored_token(&persist).await;
            Ok::<_, kube::Error>(t.filter(|t| *t != registration && *t != first))
        },
    )
    .await;

    // Revoke the registration token; a rotation still reaches the cluster and the agent
    // reports it applied — requests made after the revocation, with its own token.
    secrets
        .delete("registration-ticket", &DeleteParams::default())
        .await
        .unwrap();
    let old = client_with(env, &BearerToken::new(registration.clone())).await;
    eventually("the registration token is refused", WAIT, || async {
        Ok::<_, kube::Error>((list_status(&old, &ns).await == Err(401)).then_some(()))
    })
    .await;
    // A rotation changes the copies, not the BundleDeployment: the agent reports the copies it
    // applied in `appliedCopiesID` (decision 0089-signed-copies).
    let copies_applied = |bd: &tender_types::BundleDeployment| {
        bd.status.as_ref().and_then(|s| s.applied_copies_id.clone())
    };
    let before = copies_applied(&ws.bds("east").get("app").await.unwrap());
    ws.source_secret("db-creds", &[("password", "v2")]).await;
    tender_e2e::fixture::wait_secret(&down, &target, "db-creds", "the rotation", |s| {
        tender_e2e::fixture::secret_value(s, "password").as_deref() == Some("v2")
    })
    .await;
    let bd = ws.ready("east", "app").await;
    assert_ne!(
        copies_applied(&bd),
        before,
        "the rotation's deployment is reported applied"
    );
    assert!(before.is_some());
    assert!(agent.exited().is_none(), "the agent is still running");

    // Its log says it renewed, never with a token, and shows no refusal.
    let text = std::fs::read_to_string(&log).unwrap();
    let renewals = text
        .lines()
        .filter(|l| l.contains("hub token renewed"))
        .count();
    assert!(renewals >= 2, "renewals logged: {renewals}\n{text}");
    for token in [&registration, &first, &second] {
        let sig = token.rsplit('.').next().unwrap();
        assert!(!text.contains(sig), "a token in the agent's log");
    }
    for refusal in ["Unauthorized", "forbidden", "Forbidden"] {
        assert!(
            !text.contains(refusal),
            "{refusal} in the agent's log:\n{text}"
        );
    }
    agent.stop(Duration::from_secs(5));
}
