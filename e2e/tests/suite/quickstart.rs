//! The README's "Quick start on real clusters", step by step, on a real hub and one real
//! downstream cluster, with tender's real binaries as processes.
//!
//! Every command is the README's, with the same flags, in the same order; only what needs a
//! container runtime is replaced, each time by the closest real thing:
//! - `docker build`/`docker push` → `cargo build` of the same binaries (the image tags are still
//!   passed to Helm and `tender cluster add`, and the test checks they land in the Deployments);
//! - a pod running an image → the binary started as a process from the Deployment's own args
//!   and env, with its Secret volumes as files and its ServiceAccount's token (TokenRequest API)
//!   as its identity — the hub runs as the chart's ServiceAccount, the agent as the downstream
//!   ServiceAccount and hub kubeconfig `tender cluster add` printed, never as admin;
//! - `kubectl apply -f`/`kubectl delete -f` → server-side apply/delete of the same files;
//! - the agent chart of the "…or with Helm" alternative is rendered (`helm template`), not
//!   installed, since the printed manifests already installed this cluster's agent.
//!
//! `kubectl get tender` (the CRDs' category) is proven in `crds.rs`.
//!
//! If the README's quick start changes, this test changes with it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tender_e2e::apply::{apply_yaml, delete_yaml, parse_objects};
use tender_e2e::binaries::tender_binaries;
use tender_e2e::local_pod::local_pod;
use tender_e2e::{
    ADMIN_USER, EnvOptions, HUB, Process, TestEnv, downstream_name, ensure_helm, eventually,
};
use tender_types::{BundleDeployment, labels};

/// Where the README's user pushed their images (`$REGISTRY`).
const REGISTRY: &str = "registry.example.test/you";
/// The chart's appVersion, the tag the README builds.
const TAG: &str = "v0.1.0";
/// The README's downstream cluster, as named on the hub and as its kubectl context.
const CLUSTER: &str = "east-1";
const WAIT: Duration = Duration::from_secs(90);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn free_port() -> u16 {
    tender_e2e::free_port().expect("a free port")
}

/// The user's shell: the repository as working directory, `KUBECONFIG` with the hub as
/// current context and the downstream cluster as context `east-1`, Helm's state in `work`.
struct Shell {
    work: PathBuf,
    kubeconfig: PathBuf,
}

impl Shell {
    /// Runs `program args` like the README does; panics with its output if it fails.
    async fn run(&self, program: &Path, args: &[&str]) -> Output {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .current_dir(repo_root())
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CONFIG_HOME", self.work.join("helm/config"))
            .env("HELM_CACHE_HOME", self.work.join("helm/cache"))
            .env("HELM_DATA_HOME", self.work.join("helm/data"))
            .env_remove("TENDER_WORKSPACE")
            .env_remove("TENDER_HUB_KUBECONFIG");
        let line = format!("{} {}", program.display(), args.join(" "));
        let out = tokio::task::spawn_blocking(move || cmd.output().expect("running a command"))
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "`{line}` failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}

/// A kubeconfig with the hub as current context and the downstream cluster as `east-1`,
/// both as admin: the README's user.
fn user_kubeconfig(env: &TestEnv) -> Kubeconfig {
    let hub = Kubeconfig::from_yaml(&env.kubeconfig_as(HUB, ADMIN_USER)).unwrap();
    let mut east =
        Kubeconfig::from_yaml(&env.kubeconfig_as(&downstream_name(1), ADMIN_USER)).unwrap();
    east.clusters[0].name = CLUSTER.into();
    east.auth_infos[0].name = format!("{CLUSTER}-admin");
    east.contexts[0].name = CLUSTER.into();
    let ctx = east.contexts[0].context.as_mut().unwrap();
    ctx.cluster = CLUSTER.into();
    ctx.user = Some(format!("{CLUSTER}-admin"));
    hub.merge(east).unwrap()
}

async fn context_client(kubeconfig: &Kubeconfig, context: &str) -> kube::Client {
    let options = KubeConfigOptions {
        context: Some(context.into()),
        ..Default::default()
    };
    let config = kube::Config::from_custom_kubeconfig(kubeconfig.clone(), &options)
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

fn container_image(d: &Deployment) -> String {
    d.spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .image
        .clone()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[tokio::test]
async fn the_readme_quick_start_works_on_real_clusters() {
    let env = TestEnv::start(EnvOptions {
        downstream: 1,
        state_dir: None,
    })
    .await
    .expect("starting the test environment");
    let work = env.state_dir().join("quickstart");
    std::fs::create_dir_all(&work).unwrap();
    let user = user_kubeconfig(&env);
    let shell = Shell {
        kubeconfig: work.join("user.kubeconfig"),
        work: work.clone(),
    };
    std::fs::write(&shell.kubeconfig, serde_saphyr::to_string(&user).unwrap()).unwrap();
    let hub = context_client(&user, HUB).await;
    let east = context_client(&user, CLUSTER).await;
    let hub_server = env.cluster(HUB).server.clone();

    // 0. Images and the CLI. `docker build` compiles these same three binaries.
    let bins = tokio::task::spawn_blocking(tender_binaries)
        .await
        .unwrap()
        .expect("building tender-hub, tender-agent and tender");
    let helm = tokio::task::spawn_blocking(ensure_helm)
        .await
        .unwrap()
        .expect("building helm");
    let hub_image = format!("{REGISTRY}/tender-hub");
    let agent_image = format!("{REGISTRY}/tender-agent:{TAG}");

    // 1. helm install tender-hub deploy/charts/tender-hub -n tender-system --create-namespace \
    //      --set image.repository=$REGISTRY/tender-hub
    shell
        .run(
            &helm,
            &[
                "install",
                "tender-hub",
                "deploy/charts/tender-hub",
                "-n",
                "tender-system",
                "--create-namespace",
                "--set",
                &format!("image.repository={hub_image}"),
            ],
        )
        .await;
    let hub_deployment = Api::<Deployment>::namespaced(hub.clone(), "tender-system")
        .get("tender-hub")
        .await
        .expect("the chart's Deployment");
    assert_eq!(
        container_image(&hub_deployment),
        format!("{hub_image}:{TAG}")
    );
    // The pod, as the chart's ServiceAccount (not admin), from the chart's own args and env;
    // only the metrics port moves to a free one.
    let mut hub_pod = local_pod(
        &hub,
        &hub_server,
        env.ca_pem(),
        &hub_deployment,
        "tender-hub-0",
        &work.join("hub-pod"),
    )
    .await
    .unwrap();
    assert!(
        hub_pod.args.iter().any(|a| a == "--log-format=json"),
        "the chart keeps JSON logs: {:?}",
        hub_pod.args
    );
    hub_pod.set_flag("--metrics-addr", &format!("127.0.0.1:{}", free_port()));
    let kubeconfig = hub_pod.kubeconfig.display().to_string();
    hub_pod.set_flag("--kubeconfig", &kubeconfig);
    let hub_log = work.join("tender-hub.log");
    // Under its pod's securityContext and volumes (bubblewrap, tender_e2e::local_pod).
    let (program, args) = hub_pod.command(&bins.hub);
    let mut hub_process =
        Process::start_with_env("tender-hub", &program, &args, &hub_pod.env, &hub_log).unwrap();

    // 2. kubectl create namespace tender-default
    Api::<Namespace>::all(hub.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some("tender-default".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    //    tender cluster add east-1 -n tender-default -l env=prod -l region=eu \
    //      --hub-server https://hub.example.com:6443 --image $REGISTRY/tender-agent:v0.1.0 \
    //      > east-1-agent.yaml
    let add = shell
        .run(
            &bins.cli,
            &[
                "cluster",
                "add",
                CLUSTER,
                "-n",
                "tender-default",
                "-l",
                "env=prod",
                "-l",
                "region=eu",
                "--hub-server",
                &hub_server,
                "--image",
                &agent_image,
                "--bundle-namespace",
                "apps",
            ],
        )
        .await;
    let agent_yaml = stdout(&add);
    std::fs::write(work.join("east-1-agent.yaml"), &agent_yaml).unwrap();
    //    kubectl --context east-1 apply -f east-1-agent.yaml
    apply_yaml(&east, &agent_yaml)
        .await
        .expect("the printed manifests apply downstream");
    let agent_deployment = Api::<Deployment>::namespaced(east.clone(), "tender-system")
        .get("tender-agent")
        .await
        .unwrap();
    assert_eq!(container_image(&agent_deployment), agent_image);
    // The agent pod: the downstream ServiceAccount those manifests created, and the hub
    // kubeconfig from the Secret they carry, mounted where the Deployment says.
    let mut agent_pod = local_pod(
        &east,
        &env.cluster(&downstream_name(1)).server,
        env.ca_pem(),
        &agent_deployment,
        "tender-agent-0",
        &work.join("agent-pod"),
    )
    .await
    .unwrap();
    assert!(
        agent_pod
            .args
            .iter()
            .any(|a| a == "--hub-kubeconfig=/etc/tender/hub/kubeconfig")
            && agent_pod
                .sandbox
                .join(" ")
                .contains("agent-pod/volumes/hub /etc/tender/hub"),
        "the hub kubeconfig comes from the mounted Secret: {:?} {:?}",
        agent_pod.args,
        agent_pod.sandbox
    );
    agent_pod.set_flag("--metrics-addr", &format!("127.0.0.1:{}", free_port()));
    let kubeconfig = agent_pod.kubeconfig.display().to_string();
    agent_pod.set_flag("--kubeconfig", &kubeconfig);
    let agent_log = work.join("tender-agent.log");
    let (program, args) = agent_pod.command(&bins.agent);
    let mut agent_process =
        Process::start_with_env("tender-agent", &program, &args, &agent_pod.env, &agent_log)
            .unwrap();

    // …or with Helm: `--kubeconfig-out` writes the same hub kubeconfig for the agent chart.
    // (Rendered, not installed: the manifests above already installed this agent.)
    shell
        .run(
            &bins.cli,
            &[
                "cluster",
                "add",
                CLUSTER,
                "-n",
                "tender-default",
                "-l",
                "env=prod",
                "-l",
                "region=eu",
                "--hub-server",
                &hub_server,
                "--kubeconfig-out",
                work.join("east-1.hub.kubeconfig").to_str().unwrap(),
            ],
        )
        .await;
    //    HUB_KEYS=$(kubectl -n tender-system get secret tender-hub-signing-keys \
    //      -o jsonpath='{.data.public-keys}' | base64 -d)
    let hub_keys = Api::<Secret>::namespaced(hub.clone(), "tender-system")
        .get("tender-hub-signing-keys")
        .await
        .expect("the hub's signing-key Secret, created by its leader");
    let hub_keys = String::from_utf8(hub_keys.data.unwrap()["public-keys"].0.clone()).unwrap();
    let agent_chart = shell
        .run(
            &helm,
            &[
                "--kube-context",
                CLUSTER,
                "template",
                "tender-agent",
                "deploy/charts/tender-agent",
                "-n",
                "tender-system",
                "--create-namespace",
                "--set",
                &format!("clusterName={CLUSTER}"),
                "--set-file",
                &format!(
                    "hubKubeconfig={}",
                    work.join("east-1.hub.kubeconfig").display()
                ),
                "--set",
                &format!("image.repository={REGISTRY}/tender-agent"),
                "--set",
                "bundleServiceAccount.namespaces={apps}",
                "--set",
                &format!("hubSigningKeys={hub_keys}"),
            ],
        )
        .await;
    let kubeconfig_out = std::fs::read_to_string(work.join("east-1.hub.kubeconfig")).unwrap();
    let printed_secret: Secret = Api::namespaced(east.clone(), "tender-system")
        .get("tender-agent-hub")
        .await
        .unwrap();
    // Each `cluster add` asks for a fresh expiring token of the same ServiceAccount, so the
    // two kubeconfigs differ in the token only.
    let printed = String::from_utf8(printed_secret.data.unwrap()["kubeconfig"].0.clone()).unwrap();
    let (printed, printed_sub) = without_token(&printed);
    let (out, out_sub) = without_token(&kubeconfig_out);
    assert_eq!(
        printed, out,
        "both install paths give the agent the same hub kubeconfig but for its token"
    );
    assert_eq!(
        printed_sub, out_sub,
        "both tokens are the agent ServiceAccount's"
    );
    assert!(
        printed_sub.ends_with(":tender-agent"),
        "the token is the agent ServiceAccount's: {printed_sub}"
    );
    let chart_objects = parse_objects(&stdout(&agent_chart)).unwrap();
    let chart_deployment = chart_objects
        .iter()
        .find(|o| o.types.as_ref().unwrap().kind == "Deployment")
        .unwrap();
    assert_eq!(
        chart_deployment.data["spec"]["template"]["spec"]["containers"][0]["image"],
        agent_image.as_str()
    );
    // Both install paths give the agent the hub's public keys, so it deploys signed copies.
    let printed_keys = agent_deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.containers[0].env.as_ref())
        .and_then(|env| env.iter().find(|e| e.name == "TENDER_HUB_SIGNING_KEYS"))
        .and_then(|e| e.value.clone());
    let chart_keys = chart_deployment.data["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .and_then(|env| env.iter().find(|e| e["name"] == "TENDER_HUB_SIGNING_KEYS"))
        .and_then(|e| e["value"].as_str().map(str::to_string));
    assert_eq!(printed_keys.as_deref(), Some(hub_keys.trim()));
    assert_eq!(chart_keys.as_deref(), Some(hub_keys.trim()));

    // 3. kubectl apply -f examples/sources.yaml -f examples/bundle.yaml
    let examples = repo_root().join("examples");
    let sources = std::fs::read_to_string(examples.join("sources.yaml")).unwrap();
    let bundle = std::fs::read_to_string(examples.join("bundle.yaml")).unwrap();
    apply_yaml(&hub, &sources).await.unwrap();
    apply_yaml(&hub, &bundle).await.unwrap();

    // The copies and the manifests arrive downstream in the Bundle's defaultNamespace.
    let secrets: Api<Secret> = Api::namespaced(east.clone(), "apps");
    let config_maps: Api<ConfigMap> = Api::namespaced(east.clone(), "apps");
    let service_accounts: Api<ServiceAccount> = Api::namespaced(east.clone(), "apps");
    let logs = format!("(logs: {} and {})", hub_log.display(), agent_log.display());
    eventually(
        &format!("the example Bundle downstream {logs}"),
        WAIT,
        || async {
            let all = secrets.get_opt("registry-creds").await?.is_some()
                && config_maps.get_opt("app-settings").await?.is_some()
                && config_maps.get_opt("app-wiring").await?.is_some()
                && service_accounts.get_opt("puller").await?.is_some();
            Ok::<_, kube::Error>(all.then_some(()))
        },
    )
    .await;
    let copy = secrets.get("registry-creds").await.unwrap();
    assert_eq!(
        copy.type_.as_deref(),
        Some("kubernetes.io/dockerconfigjson")
    );

    //    tender status -n tender-default
    let table = eventually(
        &format!("`tender status` to report the Bundle Ready {logs}"),
        WAIT,
        || async {
            let out = shell
                .run(&bins.cli, &["status", "-n", "tender-default"])
                .await;
            let text = stdout(&out);
            let ready = text.lines().any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() >= 3
                    && cols[0] == "registry-creds"
                    && cols[1] == "1/1"
                    && cols[2] == "True"
            });
            let cluster_ready = text.lines().any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                // CLUSTER MODE STATE ...: a pulled cluster whose agent reports in.
                cols.len() >= 3 && cols[0] == CLUSTER && cols[1] == "Pull" && cols[2] == "Ready"
            });
            Ok::<_, std::convert::Infallible>((ready && cluster_ready).then_some(text))
        },
    )
    .await;
    //    tender status registry-creds -n tender-default   (here with -o json)
    let out = shell
        .run(
            &bins.cli,
            &[
                "status",
                "registry-creds",
                "-n",
                "tender-default",
                "-o",
                "json",
            ],
        )
        .await;
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["bundle"]["ready"], "True", "{report:#}");
    assert_eq!(
        report["clusters"].as_array().unwrap().len(),
        1,
        "{report:#}"
    );
    let target = &report["clusters"][0];
    assert_eq!(target["cluster"], CLUSTER, "{report:#}");
    assert_eq!(target["state"], "Ready", "{report:#}");
    assert_eq!(target["ready"], "True", "{report:#}");
    //    kubectl tender status: the same binary under the plugin's name.
    let plugin = work.join("bin/kubectl-tender");
    std::fs::create_dir_all(plugin.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&bins.cli, &plugin).unwrap();
    let out = shell
        .run(&plugin, &["status", "-n", "tender-default"])
        .await;
    assert!(stdout(&out).contains("registry-creds"), "{}", stdout(&out));
    assert_eq!(
        table.lines().next(),
        stdout(&out).lines().next(),
        "the plugin prints the same table"
    );

    // 4. kubectl delete -f examples/bundle.yaml: everything it deployed leaves the cluster.
    delete_yaml(&hub, &bundle).await.unwrap();
    eventually(
        &format!("the example Bundle's objects to leave the downstream cluster {logs}"),
        WAIT,
        || async {
            let none = secrets.get_opt("registry-creds").await?.is_none()
                && config_maps.get_opt("app-settings").await?.is_none()
                && config_maps.get_opt("app-wiring").await?.is_none()
                && service_accounts.get_opt("puller").await?.is_none();
            Ok::<_, kube::Error>(none.then_some(()))
        },
    )
    .await;
    let selector = format!("{}={}", labels::BUNDLE_NAME, "registry-creds");
    eventually(
        "the BundleDeployment to be gone from the hub",
        WAIT,
        || async {
            let left = Api::<BundleDeployment>::all(hub.clone())
                .list(&ListParams::default().labels(&selector))
                .await?;
            Ok::<_, kube::Error>(left.items.is_empty().then_some(()))
        },
    )
    .await;

    // Both processes ran the whole journey, with the rights their manifests grant them.
    assert!(hub_process.exited().is_none(), "tender-hub exited {logs}");
    assert!(
        agent_process.exited().is_none(),
        "tender-agent exited {logs}"
    );
    agent_process.stop(Duration::from_secs(10));
    hub_process.stop(Duration::from_secs(10));
    let hub_text = std::fs::read_to_string(&hub_log).unwrap();
    let agent_text = std::fs::read_to_string(&agent_log).unwrap();
    for (name, text) in [("tender-hub", &hub_text), ("tender-agent", &agent_text)] {
        // A search of an empty log proves nothing.
        assert!(
            text.lines().count() > 5,
            "{name} logged almost nothing:\n{text}"
        );
        let forbidden: Vec<&str> = text
            .lines()
            .filter(|l| l.to_ascii_lowercase().contains("forbidden"))
            .collect();
        assert!(
            forbidden.is_empty(),
            "{name} was refused by RBAC:\n{}",
            forbidden.join("\n")
        );
        assert!(
            !text.contains('\u{1b}'),
            "{name} wrote ANSI colour codes into a file"
        );
    }
    assert!(
        hub_text.lines().count() > 0 && hub_text.lines().all(|l| l.trim_start().starts_with('{')),
        "the chart's hub logs JSON"
    );
}

/// A kubeconfig as JSON without its users' tokens, and the `sub` claim of its token (which
/// ServiceAccount it authenticates as). The token must expire: no long-lived credential.
fn without_token(kubeconfig: &str) -> (serde_json::Value, String) {
    let kc = Kubeconfig::from_yaml(kubeconfig).unwrap();
    let token = tender_agent::credentials::kubeconfig_token(&kc).expect("a token kubeconfig");
    assert!(
        tender_runtime::token::expiry(&token).is_some(),
        "the agent's hub token expires"
    );
    use base64::Engine as _;
    let claims: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token.split('.').nth(1).unwrap())
            .unwrap(),
    )
    .unwrap();
    let mut value = serde_json::to_value(&kc).unwrap();
    value["users"] = serde_json::Value::Null;
    (
        value,
        claims["sub"].as_str().unwrap_or_default().to_string(),
    )
}
