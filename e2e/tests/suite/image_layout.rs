//! Issue 40 item 3: the images as `deploy/Dockerfile` lays them out. Each final stage installs
//! the tools its binary looks for (the binary's own `--help` names the variables it reads),
//! and a push cluster's Helm Bundle renders in the hub image's file layout: the real
//! `tender-hub` binary run under bubblewrap with only what the hub stage copies, at the paths
//! it copies them to, its `ENV`, its user and a read-only root.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use serde_json::json;
use tender_e2e::binaries::tender_binaries;
use tender_e2e::charts::RouteRepo;
use tender_e2e::dockerfile::{Stage, stages};
use tender_e2e::fixture::Workspace;
use tender_e2e::{
    ADMIN_USER, HUB, Process, downstream_name, ensure_helm, eventually, shared_env, unique_name,
};

/// Variables a binary reads that name a tool its stage must install.
const TOOL_VARIABLES: &[&str] = &["TENDER_HELM_PATH"];

fn dockerfile() -> Vec<Stage> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/Dockerfile");
    stages(&std::fs::read_to_string(path).unwrap())
}

fn stage<'a>(all: &'a [Stage], name: &str) -> &'a Stage {
    all.iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no stage {name} in deploy/Dockerfile"))
}

/// The local file a stage's `COPY --from=<from> <src>` takes: the built binary of that name,
/// or the Helm CLI the tests build from the same pin.
fn local_source(from: Option<&str>, src: &str) -> PathBuf {
    let bins = tender_binaries().unwrap();
    match (from, Path::new(src).file_name().and_then(|f| f.to_str())) {
        (Some("build"), Some("tender-hub")) => bins.hub.clone(),
        (Some("build"), Some("tender-agent")) => bins.agent.clone(),
        (Some("build"), Some("tender")) => bins.cli.clone(),
        (Some("helm"), Some("helm")) => ensure_helm().unwrap(),
        other => panic!("a COPY this test does not know: {other:?}"),
    }
}

#[test]
fn each_image_stage_installs_what_its_binary_looks_for() {
    let all = dockerfile();
    // The helm stage builds the pin the tests use.
    let helm = stage(&all, "helm");
    assert!(
        helm.copies
            .iter()
            .any(|(from, src, _)| from.is_none() && src == "e2e/tools/helm/"),
        "the helm stage builds e2e/tools/helm: {helm:?}"
    );
    for name in ["hub", "agent"] {
        let s = stage(&all, name);
        let entry = s.entrypoint.clone().expect("an ENTRYPOINT");
        let (from, src, _) = s
            .copies
            .iter()
            .find(|(_, _, dest)| *dest == entry)
            .unwrap_or_else(|| panic!("{name}: nothing is copied to its ENTRYPOINT {entry}"));
        let binary = local_source(from.as_deref(), src);
        let help = std::process::Command::new(&binary)
            .arg("--help")
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&help.stdout).to_string();
        for var in TOOL_VARIABLES {
            if !help.contains(&format!("[env: {var}=")) {
                assert!(
                    !s.env.contains_key(*var),
                    "{name} sets {var}, which its binary does not read"
                );
                continue;
            }
            let path = s.env.get(*var).unwrap_or_else(|| {
                panic!(
                    "{name}: its binary reads {var}; the stage must set it to the tool it installs"
                )
            });
            assert!(
                s.copies.iter().any(|(_, _, dest)| dest == path),
                "{name}: {var}={path}, but the stage copies nothing there: {:?}",
                s.copies
            );
        }
        // Nothing installed that nothing reads.
        for (from, _, dest) in &s.copies {
            if from.as_deref() == Some("helm") {
                assert!(
                    s.env.values().any(|v| v == dest),
                    "{name}: {dest} is installed but no variable points at it"
                );
            }
        }
    }
}

const CHART: &str = "layout";
const VERSION: &str = "0.1.0";
const TEMPLATE: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-rendered\ndata:\n  greeting: {{ .Values.greeting | quote }}\n";

async fn chart_repo() -> RouteRepo {
    RouteRepo::serving_chart(
        CHART,
        VERSION,
        &[("templates/cm.yaml", TEMPLATE.as_bytes())],
    )
    .await
    .unwrap()
}

/// bubblewrap's arguments for `stage`'s file layout: the host's root read-only, a fresh
/// `/tmp`, an empty `/usr/local/bin` holding exactly what the stage copies there, its `ENV`
/// and its user (65532), then the hub's kubeconfig at `/tmp/hub.kubeconfig`.
fn image_sandbox(stage: &Stage, kubeconfig: &Path) -> Vec<String> {
    let mut args: Vec<String> = [
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--tmpfs",
        "/tmp",
        "--tmpfs",
        "/usr/local/bin",
        "--unshare-user",
        "--uid",
        "65532",
        "--gid",
        "65532",
        "--clearenv",
        "--setenv",
        "PATH",
        // distroless's PATH: /usr/local/bin holds only what the stage copied.
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    ]
    .map(String::from)
    .to_vec();
    for (from, src, dest) in &stage.copies {
        args.extend([
            "--ro-bind".into(),
            local_source(from.as_deref(), src).display().to_string(),
            dest.clone(),
        ]);
    }
    for (k, v) in &stage.env {
        args.extend(["--setenv".into(), k.clone(), v.clone()]);
    }
    args.extend([
        "--ro-bind".into(),
        kubeconfig.display().to_string(),
        "/tmp/hub.kubeconfig".into(),
    ]);
    args
}

#[tokio::test]
async fn a_push_cluster_renders_a_helm_bundle_in_the_hub_images_layout() {
    assert!(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .all(|d| !d.join("helm").exists() || d.starts_with("/usr/local/bin")),
        "a helm on the host's PATH outside /usr/local/bin would be visible in the sandbox"
    );
    let env = shared_env(1).await;
    let repo = chart_repo().await;
    let ws = Workspace::without_hub(env, "image-layout").await;
    let all = dockerfile();
    let hub_stage = stage(&all, "hub");

    // The hub's kubeconfig, readable by the image's user.
    let dir = env.state_dir().join(unique_name("image-layout"));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("hub.kubeconfig");
    std::fs::write(&kubeconfig, env.kubeconfig_as(HUB, ADMIN_USER)).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&kubeconfig, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let port = tender_e2e::free_port().unwrap();
    let mut args = image_sandbox(hub_stage, &kubeconfig);
    args.push("--".into());
    args.push(hub_stage.entrypoint.clone().unwrap());
    args.extend([
        "--kubeconfig=/tmp/hub.kubeconfig".to_string(),
        format!("--workspace-namespace={}", ws.ns),
        format!("--lease-namespace={}", ws.ns),
        format!("--metrics-addr=127.0.0.1:{port}"),
        "--push-probe-seconds=1".to_string(),
    ]);
    let _hub = Process::start(
        "tender-hub (image layout)",
        Path::new("bwrap"),
        &args,
        &dir.join("hub.log"),
    )
    .unwrap();

    // A push cluster reached with an admin kubeconfig of the downstream cluster.
    let down = downstream_name(1);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("layout-kubeconfig".into()),
            ..Default::default()
        },
        string_data: Some(BTreeMap::from([(
            "value".to_string(),
            env.kubeconfig_as(&down, ADMIN_USER),
        )])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(ws.hub.clone(), &ws.ns)
        .patch(
            "layout-kubeconfig",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&secret),
        )
        .await
        .unwrap();
    ws.cluster_with_spec(
        "pushed",
        json!({"kubeconfigSecretRef": {"name": "layout-kubeconfig"}}),
    )
    .await;
    let target = unique_name("layout");
    ws.bundle(
        "layout",
        json!({
            "targets": [{"clusterName": "pushed"}],
            "targetNamespace": target,
            "helm": {"chart": CHART, "repo": repo.url, "version": VERSION,
                     "values": {"greeting": "rendered by the hub image"}},
        }),
    )
    .await;

    let cms = Api::<ConfigMap>::namespaced(ws.downstream(&down).await, &target);
    let cm = eventually(
        "the chart rendered by the hub's in-image helm, deployed downstream",
        Duration::from_secs(120),
        || async {
            let found = cms.get_opt("layout-rendered").await?;
            Ok::<_, kube::Error>(found)
        },
    )
    .await;
    assert_eq!(
        cm.data.unwrap()["greeting"],
        "rendered by the hub image",
        "hub log: {}",
        dir.join("hub.log").display()
    );
}
