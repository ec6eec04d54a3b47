//! `tender-testenv`: start or stop the loopback multi-cluster environment from a shell.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use tender_e2e::{EnvOptions, TestEnv};

#[derive(Parser)]
#[command(
    version,
    about = "Real hub + downstream Kubernetes control planes on loopback"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start etcd, the hub and N downstream clusters; write DIR/<cluster>.kubeconfig and
    /// DIR/ready. Runs until Ctrl-C, SIGTERM or `down`, unless --detach.
    Up {
        /// Number of downstream clusters.
        #[arg(long, default_value_t = 2, env = "TENDER_TESTENV_DOWNSTREAM")]
        downstream: usize,
        /// State directory (kubeconfigs, logs, etcd data).
        #[arg(long, env = "TENDER_TESTENV_STATE_DIR")]
        state_dir: PathBuf,
        /// Return once the environment is ready and keep it running in the background.
        #[arg(long)]
        detach: bool,
    },
    /// Stop the environment recorded in DIR/env.json.
    Down {
        /// State directory given to `up`.
        #[arg(long, env = "TENDER_TESTENV_STATE_DIR")]
        state_dir: PathBuf,
    },
    /// Build the control-plane binary (if needed) and print its path.
    Build,
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Up {
            downstream,
            state_dir,
            detach: true,
        } => detach(downstream, state_dir),
        Command::Up {
            downstream,
            state_dir,
            detach: false,
        } => up(downstream, state_dir),
        Command::Down { state_dir } => tender_e2e::down(&state_dir),
        Command::Build => {
            println!("{}", tender_e2e::ensure_controlplane()?.display());
            Ok(())
        }
    }
}

fn up(downstream: usize, state_dir: PathBuf) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let started = Instant::now();
        let env = TestEnv::start(EnvOptions {
            downstream,
            state_dir: Some(state_dir),
        })
        .await?;
        eprintln!(
            "tender-testenv: {} clusters ready in {:.1}s",
            env.clusters().len(),
            started.elapsed().as_secs_f64()
        );
        for c in env.clusters() {
            println!("{}\t{}\t{}", c.name, c.server, c.kubeconfig.display());
        }
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut tick = tokio::time::interval(Duration::from_secs(2));
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break,
                _ = term.recv() => break,
                _ = tick.tick() => {
                    if let Err(e) = env.check_alive() {
                        env.stop();
                        return Err(e);
                    }
                }
            }
        }
        eprintln!("tender-testenv: stopping");
        env.stop();
        Ok(())
    })
}

/// Re-runs `up` in a new session with output to DIR/testenv.log and waits for DIR/ready.
#[allow(unsafe_code)] // libc calls, each with a SAFETY comment
fn detach(downstream: usize, state_dir: PathBuf) -> Result<()> {
    use std::os::unix::process::CommandExt;
    std::fs::create_dir_all(&state_dir)?;
    let log = std::fs::File::create(state_dir.join("testenv.log"))?;
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args(["up", "--downstream", &downstream.to_string(), "--state-dir"])
        .arg(&state_dir)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: setsid in the child before exec, so a terminal's Ctrl-C does not reach it.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting the background environment")?;
    let deadline = Instant::now() + Duration::from_secs(1800);
    while Instant::now() < deadline {
        if state_dir.join("ready").exists() {
            println!("ready: kubeconfigs in {}", state_dir.display());
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            bail!(
                "environment exited ({status}); see {}",
                state_dir.join("testenv.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    bail!("environment not ready in time")
}
