//! Child processes that cannot outlive the test or command that started them.
//!
//! Every child gets `PR_SET_PDEATHSIG = SIGKILL`, so it dies with its parent even when the
//! parent is killed outright. The kernel ties that signal to the *thread* that forked, so
//! all children are forked from one spawner thread that lives as long as the process:
//! an environment shared by many tests survives the end of the test that created it, and
//! still goes away when the test binary exits or panics.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

type Request = (Command, mpsc::Sender<std::io::Result<Child>>);

fn spawner() -> &'static Mutex<mpsc::Sender<Request>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("tender-e2e-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
                // The sender lives in a static and is never dropped: park forever so the
                // thread (and with it the children's parent-death signal) lasts until exit.
                loop {
                    std::thread::park();
                }
            })
            .expect("spawning the process spawner thread");
        Mutex::new(tx)
    })
}

/// A running child process, killed (SIGTERM, then SIGKILL) when dropped.
#[derive(Debug)]
pub struct Process {
    name: String,
    child: Child,
    /// What started it, so [`Process::restart`] can start the same command again.
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
}

impl Process {
    /// Starts `program args` with stdout and stderr appended to `log`.
    pub fn start(name: &str, program: &Path, args: &[String], log: &Path) -> Result<Process> {
        Self::start_with_env(name, program, args, &[], log)
    }

    /// Starts `program args` with `env` added to the inherited environment and stdout and
    /// stderr appended to `log`.
    pub fn start_with_env(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        log: &Path,
    ) -> Result<Process> {
        Ok(Process {
            name: name.to_string(),
            child: spawn(name, program, args, env, log)?,
            program: program.to_path_buf(),
            args: args.to_vec(),
            env: env.to_vec(),
            log: log.to_path_buf(),
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The component name given at start.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The log file its stdout and stderr are appended to.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// `Some(status)` if the process has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Stops the process: SIGTERM, up to `grace` to exit, then SIGKILL; always reaps it.
    /// Under bubblewrap the SIGTERM goes to the sandboxed program (bwrap forwards no signal,
    /// and its death would SIGKILL the program), so it shuts down as gracefully as in a pod.
    pub fn stop(&mut self, grace: Duration) {
        if self.exited().is_some() {
            return;
        }
        terminate(self.sandboxed_pid().unwrap_or(self.child.id()), grace);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The program's pid when this process is bubblewrap running it (bwrap's only child).
    fn sandboxed_pid(&self) -> Option<u32> {
        if self.program.file_name()? != "bwrap" {
            return None;
        }
        let id = self.child.id();
        let children = std::fs::read_to_string(format!("/proc/{id}/task/{id}/children")).ok()?;
        children.split_whitespace().next()?.parse().ok()
    }

    /// Kills the process outright (SIGKILL, like a crash or an OOM kill) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the same command again (same program, args, environment and log, appended), from
    /// the same spawner thread, so the new child dies with this process too. Stops the old one
    /// first if it still runs.
    pub fn restart(&mut self) -> Result<()> {
        self.stop(Duration::from_secs(5));
        self.child = spawn(&self.name, &self.program, &self.args, &self.env, &self.log)?;
        Ok(())
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// Forks `program args` from the spawner thread with the parent-death signal set.
#[allow(unsafe_code)] // libc calls, each with a SAFETY comment
fn spawn(
    name: &str,
    program: &Path,
    args: &[String],
    env: &[(String, String)],
    log: &Path,
) -> Result<Child> {
    let out = File::options()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    // SAFETY: prctl is async-signal-safe; this runs in the forked child before exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    spawner()
        .lock()
        .unwrap()
        .send((cmd, tx))
        .context("spawner thread is gone")?;
    rx.recv()
        .context("spawner thread is gone")?
        .with_context(|| format!("starting {name} ({})", program.display()))
}

/// Sends SIGTERM to `pid` and waits up to `grace` for it to disappear; SIGKILL after that.
#[allow(unsafe_code)] // libc calls, each with a SAFETY comment
pub fn terminate(pid: u32, grace: Duration) {
    let pid = pid as libc::pid_t;
    // SAFETY: plain kill(2) calls on a pid.
    unsafe {
        if libc::kill(pid, libc::SIGTERM) != 0 {
            return;
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            let mut status = 0;
            // Reap if it is our child; otherwise probe with signal 0.
            let reaped = libc::waitpid(pid, &mut status, libc::WNOHANG);
            if reaped == pid || libc::kill(pid, 0) != 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        libc::kill(pid, libc::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stop reaches the program inside bubblewrap as SIGTERM (a graceful shutdown), not as
    /// the SIGKILL bwrap's own death would send it.
    #[test]
    fn stopping_a_sandboxed_program_terminates_it_gracefully() {
        let dir = std::env::temp_dir().join(crate::unique_name("tender-process-test"));
        std::fs::create_dir_all(&dir).unwrap();
        crate::require_bubblewrap();
        let log = dir.join("log");
        let args: Vec<String> = [
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--die-with-parent",
            "--",
            "/bin/sh",
            "-c",
            "trap 'echo terminated; exit 0' TERM; echo started; while true; do sleep 0.05; done",
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        let mut p = Process::start("sandboxed", Path::new("bwrap"), &args, &log).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("started")
        {
            assert!(Instant::now() < deadline, "never started");
            std::thread::sleep(Duration::from_millis(50));
        }
        p.stop(Duration::from_secs(5));
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.contains("terminated"), "{text}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
