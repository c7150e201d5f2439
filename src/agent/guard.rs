//! The child guard (`scopegate __child-guard PID -- COMMAND ARGS...`): the agent launches every
//! stdio child through its own binary in this hidden mode, which asks the kernel to kill the
//! process when the agent dies (even by SIGKILL) and then becomes the command. It must never
//! run the command once the agent is already gone.

use std::ffi::OsString;

/// The hidden subcommand's name.
pub const SUBCOMMAND: &str = "__child-guard";

/// Why the guard could not become the command (it exits non-zero then).
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error("asking for the parent-death signal: {0}")]
    DeathSignal(std::io::Error),
    #[error("the agent (pid {0}) is already gone")]
    Orphan(u32),
    #[error("an empty command")]
    NoCommand,
    #[error("running {command:?}: {source}")]
    Exec { command: OsString, source: std::io::Error },
    #[error("the child guard runs on unix only")]
    Unsupported,
}

/// The guard's exit status when it could not become the command (as shells use for a command
/// that can't be run).
pub const FAILED: i32 = 127;

#[cfg(not(unix))]
pub fn exec(_agent: u32, _command: &[OsString]) -> GuardError {
    GuardError::Unsupported
}

/// Becomes `command` (never returns on success). `agent` is the pid of the agent that
/// launched this guard.
#[cfg(unix)]
pub fn exec(agent: u32, command: &[OsString]) -> GuardError {
    let Some((program, args)) = command.split_first() else {
        return GuardError::NoCommand;
    };
    #[cfg(target_os = "linux")]
    {
        // Survives exec: the command itself gets SIGKILL when the agent's thread ends.
        if let Err(e) = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL)) {
            return GuardError::DeathSignal(e.into());
        }
    }
    // The agent may have died before the signal was armed: then nobody would kill us.
    let parent = rustix::process::getppid().map(|p| p.as_raw_nonzero().get());
    if parent != i32::try_from(agent).ok() {
        return GuardError::Orphan(agent);
    }
    use std::os::unix::process::CommandExt;
    let source = std::process::Command::new(program).args(args).exec();
    GuardError::Exec { command: program.clone(), source }
}
