//! Confinement: seccomp filters per thread role, no new privileges, and
//! the switch from root to an unprivileged user. `docs/security-model.md`
//! says what each layer stops and why the lists are what they are.
//!
//! Order in a process: open what needs privileges, [`drop_privileges`],
//! then [`install`] the process-wide role ([`Role::Daemon`],
//! [`Role::GpuHost`], or [`Role::PartitionHost`] in a partition host),
//! then let threads with a narrower job install their
//! own role on top ([`Role::Metrics`], [`Role::Signals`]). Filters stack:
//! a thread is held to every filter it or its creator installed, and a
//! thread inherits its creator's filters.

#![warn(missing_docs)]

mod account;
mod privileges;
mod seccomp;

use std::io;

pub use account::{
    in_group, lookup_group, lookup_user, prepare_runtime_dir, share_socket, Account,
};
pub use privileges::{clear_capabilities, drop_privileges, is_root};
pub use seccomp::{allowed_syscalls, install, set_no_new_privs, Role, SeccompMode};

/// Why confinement could not be set up. The daemon does not run
/// unconfined when asked to be confined: every error stops it.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    /// The filter could not be built (a bug in the lists).
    #[error("cannot build the seccomp filter for {role:?}: {message}")]
    Build {
        /// The role.
        role: Role,
        /// What seccompiler said.
        message: String,
    },
    /// The kernel refused the filter.
    #[error("cannot install the seccomp filter for {role:?}: {message}")]
    Install {
        /// The role.
        role: Role,
        /// What the kernel said.
        message: String,
    },
    /// No such user, or its entry cannot be read.
    #[error("user {name:?}: {message}")]
    User {
        /// The name asked for.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// A system call of the privilege drop failed.
    #[error("cannot {what}")]
    Sys {
        /// The step.
        what: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The drop seemed to work but the process still holds privileges.
    #[error("privileges remain after the switch: {0}")]
    Remains(String),
}

fn sys(what: impl Into<String>) -> impl FnOnce(io::Error) -> ConfineError {
    let what = what.into();
    move |source| ConfineError::Sys { what, source }
}
