//! Changing the log filter at runtime (`/logging?level=`).

use std::fmt;
use std::sync::Arc;

type Reload = dyn Fn(&str) -> Result<(), String> + Send + Sync;

/// Applies a new tracing filter (`debug`, `ambientd::push=trace,info`, ...).
#[derive(Clone)]
pub struct LogControl(Arc<Reload>);

impl LogControl {
    pub fn new(reload: impl Fn(&str) -> Result<(), String> + Send + Sync + 'static) -> Self {
        LogControl(Arc::new(reload))
    }

    /// Applies `directives`; the error says why they were refused.
    pub fn set(&self, directives: &str) -> Result<(), String> {
        (self.0)(directives)
    }
}

impl fmt::Debug for LogControl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LogControl")
    }
}
