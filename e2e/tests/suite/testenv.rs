//! The launcher itself: two environments at once, and nothing left behind.

use std::path::Path;
use std::process::Command;

use tender_e2e::{EnvOptions, EnvRecord, HUB, TestEnv};

fn alive(pid: u32) -> bool {
    // A zombie still answers kill(0); /proc/<pid>/stat's state tells it apart.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

fn record(dir: &Path) -> EnvRecord {
    serde_json::from_slice(&std::fs::read(dir.join("env.json")).unwrap()).unwrap()
}

#[tokio::test]
async fn two_environments_run_at_once_and_stop_cleanly() {
    let (a, b) = tokio::join!(
        TestEnv::start(EnvOptions {
            downstream: 1,
            state_dir: None
        }),
        TestEnv::start(EnvOptions {
            downstream: 0,
            state_dir: None
        }),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_ne!(a.cluster(HUB).server, b.cluster(HUB).server);
    for env in [&a, &b] {
        for c in env.clusters() {
            let client = env.client(&c.name).await.unwrap();
            client.apiserver_version().await.unwrap();
        }
    }
    let pids = record(a.state_dir()).pids;
    assert_eq!(
        pids.len(),
        1 + 2 * 2,
        "etcd + apiserver and controller-manager per cluster"
    );
    let dir = a.state_dir().to_path_buf();
    drop(a);
    for pid in pids {
        assert!(!alive(pid), "process {pid} survived the environment");
    }
    assert!(
        !dir.exists(),
        "temporary state directory {} kept",
        dir.display()
    );
    // The other environment is unaffected.
    b.client(HUB)
        .await
        .unwrap()
        .apiserver_version()
        .await
        .unwrap();
}

#[test]
fn cli_up_detach_and_down() {
    let bin = env!("CARGO_BIN_EXE_tender-testenv");
    let dir = std::env::temp_dir().join(format!("tender-testenv-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let up = Command::new(bin)
        .args(["up", "--downstream", "1", "--detach", "--state-dir"])
        .arg(&dir)
        .status()
        .unwrap();
    assert!(up.success());
    assert!(dir.join("ready").exists());
    for name in ["hub", "downstream-1"] {
        assert!(dir.join(format!("{name}.kubeconfig")).exists());
    }
    let rec = record(&dir);
    assert!(alive(rec.supervisor_pid));
    // A second `up` on the same directory is refused instead of clobbering it.
    let again = Command::new(bin)
        .args(["up", "--state-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already holds an environment"));

    let down = Command::new(bin)
        .args(["down", "--state-dir"])
        .arg(&dir)
        .status()
        .unwrap();
    assert!(down.success());
    assert!(!alive(rec.supervisor_pid));
    for pid in rec.pids {
        assert!(!alive(pid), "process {pid} survived `down`");
    }
    assert!(!dir.join("ready").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
