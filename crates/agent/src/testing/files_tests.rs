//! Files carried in a BundleDeployment's `resources` (decision 0123-files-in-a-bundle), in
//! process: manifest files applied like inline manifests, a chart directory rendered as the
//! chart, and a file that cannot be read reported by name with nothing pruned.

use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use tender_types::ObjectState;
use tender_types::conditions::reason;

use super::{Agent, TARGET, lines};

fn config_map(agent: &Agent, name: &str) -> Option<Value> {
    agent.down.get("v1", "ConfigMap", Some(TARGET), name)
}

fn cm_yaml(name: &str, mode: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {TARGET}\ndata:\n  mode: {mode}\n"
    )
}

/// A deployment of Fleet's files: `manifests/cms.yaml` (two ConfigMaps, one base64 encoded
/// in a second file), an ignored README, and with `chart` the chart directory `chart/`.
fn files_spec(id: &str, mode: &str, chart: bool) -> Value {
    let b64 = base64::engine::general_purpose::STANDARD.encode(cm_yaml("second", mode));
    let mut resources = vec![
        json!({"name": "fleet.yaml", "content": "helm:\n  chart: ./chart\n"}),
        json!({"name": "README.md", "content": "# not a manifest"}),
        json!({"name": "manifests/cms.yaml",
               "content": format!("---\n{}---\n", cm_yaml("first", mode))}),
        json!({"name": "manifests/second.yml", "content": b64, "encoding": "base64"}),
    ];
    if chart {
        resources.push(json!({"name": "chart/Chart.yaml",
                              "content": "apiVersion: v2\nname: web\nversion: 0.1.0\n"}));
        resources.push(json!({"name": "chart/templates/cm.yaml", "content": "not: a manifest"}));
    }
    json!({
        "deploymentID": id,
        "options": {"defaultNamespace": TARGET},
        "resources": resources,
        "helm": {"chart": "./chart"},
    })
}

fn web_chart() -> crate::hooks::RenderedChart {
    crate::helm::parse_rendered(&format!(
        "---\n# Source: web/templates/cm.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web-settings\n  namespace: {TARGET}\ndata:\n  greeting: hi\n"
    ))
    .expect("a chart")
}

#[tokio::test(start_paused = true)]
async fn manifest_files_and_the_chart_they_carry_are_deployed() {
    let mut agent = Agent::new(|_| {}).await;
    agent.ctx.charts.prerender("./chart", Ok(web_chart()));
    agent.put_bd("app", files_spec("d1", "blue", true));
    agent.start();
    agent.run_for(Duration::from_secs(1)).await;
    for name in ["first", "second"] {
        assert_eq!(
            config_map(&agent, name).unwrap_or_else(|| panic!("{name} applied"))["data"]["mode"],
            "blue"
        );
    }
    assert!(
        config_map(&agent, "web-settings").is_some(),
        "the chart's object"
    );
    let status = agent.bd("app").status.expect("status");
    assert_eq!(status.applied_deployment_id.as_deref(), Some("d1"));
    assert!(
        status
            .resources
            .iter()
            .all(|r| r.kind == "ConfigMap" || r.kind == "Namespace"),
        "no file is taken for an object: {:?}",
        status.resources
    );
}

#[tokio::test(start_paused = true)]
async fn a_chart_directory_without_its_chart_yaml_is_reported_by_name_and_nothing_is_pruned() {
    let mut agent = Agent::new(|_| {}).await;
    agent.ctx.charts.prerender("./chart", Ok(web_chart()));
    agent.put_bd("app", files_spec("d1", "blue", true));
    agent.start();
    agent.run_for(Duration::from_secs(1)).await;
    assert!(config_map(&agent, "web-settings").is_some());

    let mark = agent.down.mark();
    agent.put_bd("app", files_spec("d2", "green", false));
    agent.run_for(Duration::from_secs(1)).await;
    let status = agent.bd("app").status.expect("status");
    let entry = status
        .resources
        .iter()
        .find(|r| r.kind == "HelmRelease")
        .expect("the chart's entry");
    assert_eq!(entry.state, ObjectState::Error);
    let msg = entry.message.as_deref().unwrap_or_default();
    assert!(msg.starts_with(reason::FILES_INVALID), "{msg}");
    assert!(msg.contains("chart/Chart.yaml: missing"), "{msg}");
    assert_ne!(status.applied_deployment_id.as_deref(), Some("d2"));
    let deletes: Vec<_> = agent
        .down
        .writes_since(mark)
        .into_iter()
        .filter(|r| r.method == http::Method::DELETE)
        .collect();
    assert!(deletes.is_empty(), "nothing pruned: {:?}", lines(&deletes));
    assert!(config_map(&agent, "web-settings").is_some());
}

#[tokio::test(start_paused = true)]
async fn a_file_that_cannot_be_decoded_or_read_is_named() {
    let mut agent = Agent::new(|_| {}).await;
    let mut spec = files_spec("d1", "blue", true);
    spec["resources"][3]["encoding"] = json!("base64+gz");
    agent.ctx.charts.prerender("./chart", Ok(web_chart()));
    agent.put_bd("app", spec);
    agent.start();
    agent.run_for(Duration::from_secs(1)).await;
    let status = agent.bd("app").status.expect("status");
    let file = status
        .resources
        .iter()
        .find(|r| r.kind == "File")
        .expect("the file's entry");
    assert_eq!(file.name, "manifests/second.yml");
    assert_eq!(file.state, ObjectState::Error);
    assert!(
        file.message
            .as_deref()
            .unwrap_or_default()
            .starts_with("FilesInvalid: manifests/second.yml: content is not valid gzip"),
        "{file:?}"
    );
    let deployed = status
        .conditions
        .iter()
        .find(|c| c.type_ == tender_types::conditions::TYPE_DEPLOYED)
        .expect("Deployed");
    assert_eq!(deployed.reason, reason::FILES_INVALID);
    assert!(
        config_map(&agent, "first").is_none(),
        "nothing read from broken files"
    );

    // A document without a kind: named with its file and document.
    let mut spec = files_spec("d2", "blue", false);
    spec["resources"][2]["content"] = json!(format!("{}---\nreplicas: 2\n", cm_yaml("first", "x")));
    spec.as_object_mut().unwrap().remove("helm");
    agent.put_bd("app", spec);
    agent.run_for(Duration::from_secs(1)).await;
    let status = agent.bd("app").status.expect("status");
    let file = status
        .resources
        .iter()
        .find(|r| r.kind == "File")
        .expect("entry");
    assert_eq!(file.name, "manifests/cms.yaml");
    assert!(
        file.message
            .as_deref()
            .unwrap_or_default()
            .contains("document 2: no apiVersion or kind"),
        "{file:?}"
    );
}
