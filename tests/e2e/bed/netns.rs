//! Network namespaces: the bed's nodes, pods and control-plane host. Each is an `ip netns`
//! namespace made by the test and removed (with every process still in it) when its
//! [`Netns`] is dropped, also when the test fails. Namespaces of this bed left by a test
//! process that no longer runs (one killed outright) are removed by [`sweep_stale`] before a
//! bed is made.
//!
//! Code of the test itself runs inside a namespace on a thread of its own ([`Netns::run`]): `setns(2)` moves only the calling thread, and a socket stays in the
//! namespace it was made in, so a listener or a connection made there can be used anywhere.

use std::fs::File;
use std::process::{Command, Stdio};

use nix::sched::{CloneFlags, setns};

/// The prefix of every namespace the bed makes: `ae<pid>-<name>`.
const PREFIX: &str = "ae";

/// A network namespace, removed on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Makes namespace `ae<pid>-<short>` with its loopback up. `short` keeps names short
    /// enough to read in `ip netns list`.
    pub fn create(short: &str) -> Netns {
        let name = format!("{PREFIX}{}-{short}", std::process::id());
        // A namespace of this name left by an earlier bed of this process goes first.
        if std::path::Path::new("/run/netns").join(&name).exists() {
            remove(&name);
        }
        run(Command::new("ip").args(["netns", "add", &name]));
        let netns = Netns { name };
        netns.ip(&["link", "set", "lo", "up"]);
        netns
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n <ns> <args>`; fails the test if it fails.
    pub fn ip(&self, args: &[&str]) {
        run(Command::new("ip").arg("-n").arg(&self.name).args(args));
    }

    /// A veth pair: `link` here, `eth0` in `peer`.
    pub fn veth(&self, link: &str, peer: &Netns) {
        self.ip(&[
            "link",
            "add",
            link,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            peer.name(),
        ]);
    }

    /// `sysctl -w key=value` inside the namespace (network sysctls are per namespace).
    pub fn sysctl(&self, key: &str, value: &str) {
        run(self
            .command("sysctl")
            .args(["-q", "-w", &format!("{key}={value}")]));
    }

    /// `iptables-restore` of `rules` inside the namespace.
    pub fn iptables_restore(&self, rules: &str) {
        use std::io::Write;
        let mut child = self
            .command("iptables-restore")
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run iptables-restore (Debian's iptables)");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(rules.as_bytes())
            .expect("write rules");
        let out = child.wait_with_output().expect("iptables-restore");
        assert!(
            out.status.success(),
            "iptables-restore in {}: {}\n{rules}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `iptables <args>` inside the namespace.
    pub fn iptables(&self, args: &[&str]) {
        run(self.command("iptables").args(args));
    }

    /// A command that runs `program` inside the namespace (`ip netns exec`, which execs it:
    /// the child's pid is the program's).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name]).arg(program);
        command
    }

    /// The namespace's file, for `setns(2)` and for ZDS (sent to ztunnel over SCM_RIGHTS).
    pub fn file(&self) -> File {
        File::open(format!("/run/netns/{}", self.name))
            .unwrap_or_else(|e| panic!("open netns {}: {e}", self.name))
    }

    /// Runs `f` on a new thread inside the namespace and returns what it returns.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let file = self.file();
        std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    setns(&file, CloneFlags::CLONE_NEWNET).expect("setns");
                    f()
                })
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        remove(&self.name);
    }
}

/// Kills what still runs in namespace `name`, then deletes it (with its interfaces, routes
/// and iptables rules).
fn remove(name: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", name]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = Command::new("kill").args(["-9", pid]).status();
        }
    }
    let _ = Command::new("ip")
        .args(["netns", "del", name])
        .stderr(Stdio::null())
        .status();
}

/// Removes the namespaces of beds whose test process has gone (killed before its drops ran).
pub fn sweep_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            remove(name);
        }
    }
}

/// Whether this process may make namespaces (root, with `ip` and `iptables-restore`).
pub fn missing_prerequisite() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("the end-to-end bed needs root (network namespaces)".into());
    }
    for (tool, package) in [("ip", "iproute2"), ("iptables-restore", "iptables")] {
        let found = Command::new(tool)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            return Some(format!("no {tool}: install Debian's {package}"));
        }
    }
    None
}

/// Runs `command`, failing the test with its stderr if it fails.
pub fn run(command: &mut Command) {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("run {command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
