//! The agent's own environment, on which a declaration's `${NAME}` references resolve; it never
//! lends out the gateway's (`${env:NAME}` is refused here as on the gateway).

use std::collections::BTreeMap;

use crate::decl::ExecutorEnv;

/// A snapshot of the agent's environment taken at start (the agent never changes its own).
#[derive(Debug, Clone, Default)]
pub struct AgentEnv {
    vars: BTreeMap<String, String>,
}

impl AgentEnv {
    /// The agent process's environment (variables that are not UTF-8 are left out).
    pub fn from_process() -> Self {
        Self::from_vars(std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))))
    }

    pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Self {
        Self { vars: vars.into_iter().collect() }
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }
}

impl ExecutorEnv for AgentEnv {
    fn var(&self, name: &str) -> Option<String> {
        self.vars.get(name).cloned()
    }
    /// The agent is never the gateway host: `${env:NAME}` (the gateway's environment) is refused.
    fn is_local(&self) -> bool {
        false
    }
    /// The agent is where references are finally resolved.
    fn deferred(&self) -> bool {
        false
    }
}
